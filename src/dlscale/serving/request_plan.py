"""One served version's request plan: what each of its requests is checked against, resolved once.

A request to a loaded model meets the same tables every time: its inputs' datatypes and fixed
dimensions, the batch bound, the outputs it may ask for, the version string its answer carries,
whether it streams. `ServedVersion.plan` builds them once, at the first request, so that the
per-request checks (serving/validation.py) are lookups and comparisons, not rebuilds
(docs/serving-rest.md, "The small-request path").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from dlscale.types import Datatype, TensorSpec

#: One input's rule: its spec, the numpy dtype its arrays have (None: none single, as BYTES),
#: its rank, and its fixed dimensions as (axis, size) pairs (-1 dimensions take any size).
InputRule = tuple[TensorSpec, np.dtype[Any] | None, int, tuple[tuple[int, int], ...]]


class RequestPlan:
    """The per-version tables a request is checked and answered with (see the module)."""

    __slots__ = ("batched", "every_output", "inputs", "max_batch_size", "model", "outputs",
                 "streams", "version")  # fmt: skip

    def __init__(
        self,
        model: str,
        version: int,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        max_batch_size: int,
        streams: bool,
    ) -> None:
        self.model = model
        #: The version as every answer names it.
        self.version = str(version)
        self.inputs: dict[str, InputRule] = {s.name: _rule(s) for s in inputs}
        self.outputs = frozenset(s.name for s in outputs)
        #: What a request that names no outputs gets: each output, whole (read-only: shared).
        self.every_output: Mapping[str, int] = MappingProxyType(
            dict.fromkeys((s.name for s in outputs), 0)
        )
        self.batched = max_batch_size > 0
        self.max_batch_size = max_batch_size
        #: Whether its requests are answered as a stream (a unary one gets the stream joined).
        self.streams = streams


def _rule(spec: TensorSpec) -> InputRule:
    dtype = None if spec.datatype is Datatype.BYTES else spec.datatype.numpy
    fixed = tuple((axis, size) for axis, size in enumerate(spec.shape) if size != -1)
    return spec, dtype, len(spec.shape), fixed
