"""A decoder's matrix products as an engine's kernels run them on a device, measured at some
row counts: the weights' share of a pass (docs/plan.md, "Generative models": measured kernels).

A roofline prices a product of M rows by an (N, K) weight at max or sum of its bytes over the
bandwidth and its FLOPs over the peak, one efficiency each. Real kernels do not follow it at
small M: on one CPU core torch's FP32 linear ran 2 and 3 rows slower than 4 (a matrix-vector
kernel at 1 row, one pass over the weights per row at 2-3, a blocked product from 4) and
vLLM's oneDNN product ran 3-6 rows faster than 1 (BENCHMARKS.md, "Generative plan: measured
kernels"). Timing the products themselves at the pass's sizes, with the model's shapes and
the weights streamed from memory as a forward pass streams them, replaces a per-batch MBU.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.errors import PlanError
from dlscale.plan.llm import DecoderShape, read_json
from dlscale.plan.llm_passes import Pass


@dataclass(frozen=True)
class KernelCurve:
    """Seconds of a set of products at each measured row count (ascending, 1 first)."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.seconds) or len(self.rows) < 2:
            raise PlanError("a kernel curve needs as many times as row counts, two at least")
        if self.rows[0] != 1 or any(b <= a for a, b in zip(self.rows, self.rows[1:], strict=False)):
            raise PlanError(f"a kernel curve's rows ascend from 1, got {self.rows}")
        if min(self.seconds) <= 0:
            raise PlanError(f"a kernel curve's times are positive, got {self.seconds}")

    def at(self, rows: float) -> float:
        """Seconds at `rows` rows: straight lines between measured counts and, past the last,
        the last two counts' slope (a product of many rows is bound by its FLOPs, which grow
        in proportion to the rows)."""
        if rows <= 0:
            return 0.0
        last, before = self.rows[-1], self.rows[-2]
        if rows <= last:
            return float(np.interp(rows, self.rows, self.seconds))
        slope = (self.seconds[-1] - self.seconds[-2]) / (last - before)
        return self.seconds[-1] + slope * (rows - last)

    def as_lists(self) -> list[list[float]]:
        """[rows, seconds], as kept in a JSON file."""
        return [list(self.rows), list(self.seconds)]

    @classmethod
    def from_lists(cls, kept: Sequence[Sequence[float]]) -> KernelCurve:
        """The curve `as_lists` wrote."""
        rows, seconds = kept
        return cls(tuple(int(r) for r in rows), tuple(float(s) for s in seconds))


@dataclass(frozen=True)
class Kernels:
    """A decoder's products on one engine and device: every layer's, over a pass's tokens,
    and the head's, over one row per sequence in the pass (both engines compute logits only
    where a token is sampled: transformers' `logits_indices`, vLLM's sampled positions)."""

    layers: KernelCurve
    head: KernelCurve

    def seconds(self, work: Pass) -> float:
        """Seconds of a pass's products, as measured."""
        return self.layers.at(work.tokens) + self.head.at(work.sequences)

    def as_dict(self) -> dict[str, list[list[float]]]:
        """{"layers": [rows, seconds], "head": [rows, seconds]}, as kept in a JSON file."""
        return {"layers": self.layers.as_lists(), "head": self.head.as_lists()}

    @classmethod
    def from_dict(cls, kept: Any) -> Kernels:
        """The curves `as_dict` wrote (KeyError, TypeError or ValueError: not such a dict)."""
        return cls(KernelCurve.from_lists(kept["layers"]), KernelCurve.from_lists(kept["head"]))


def read_kernels(path: Path) -> Kernels:
    """The curves in a JSON file (`{"layers": [rows, seconds], "head": [rows, seconds]}`, as
    benchmarks/plan_llm_check.py writes them); a PlanError says what is wrong."""
    raw = read_json(path, "a kernels file")
    try:
        return Kernels.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(
            f"{path}: want {{'layers': [rows, seconds], 'head': [rows, seconds]}} ({exc!r})"
        ) from None


def write_kernels(kernels: Kernels, path: Path) -> None:
    """The curves as read_kernels reads them."""
    path.write_text(json.dumps(kernels.as_dict()))


def layer_products(shape: DecoderShape, fused: bool) -> list[tuple[int, int]]:
    """(out, in) of each weight one layer multiplies by: q, k, v, o and the MLP's gate, up and
    down, or with `fused` (vLLM's QKVParallelLinear and MergedColumnParallelLinear) qkv, o,
    gate_up and down."""
    if shape.experts:
        raise PlanError("measured kernels cover dense decoders; a mixture's experts are not timed")
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    h, inter = shape.hidden, shape.intermediate
    if fused:
        return [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]
    return [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
