"""An engine's efficiencies from its measured times: MBU, MFU, host time per sequence and per
layer of a pass, and the share of bandwidth of a one-token pass's matrix-vector products, or,
with measured kernels, the share of their speed (docs/plan.md, "Checked against measured
runs")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlscale.errors import PlanError
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency
from dlscale.plan.llm_passes import Pass

#: The columns of a measured time: the seconds it takes at efficiencies of 1 per unknown,
#: 1 / MBU of one-token passes, 1 / MBU, 1 / MFU, host seconds per sequence in a pass, per
#: layer in a pass, per request admitted, 1 / the measured kernels' share, per burst reaching
#: an idle engine.
VECTOR, MATRIX, COMPUTE, PER_SEQUENCE, PER_LAYER, PER_REQUEST, KERNEL, PER_BURST = range(8)
_HOST = (PER_SEQUENCE, PER_LAYER, PER_REQUEST)
_EVERY_HOST = (*_HOST, PER_BURST)
#: The Efficiency field each host column is solved for.
_HOST_FIELDS = {
    PER_SEQUENCE: "host_s_per_token",
    PER_LAYER: "host_s_per_layer",
    PER_REQUEST: "host_s_per_request",
    PER_BURST: "host_s_per_burst",
}


class AboveCeiling(PlanError):
    """Measured times faster than the device's figures allow: the shares the fit found."""

    def __init__(self, message: str, mbu: float, mfu: float, mbu_vector: float | None) -> None:
        super().__init__(message)
        self.mbu, self.mfu, self.mbu_vector = mbu, mfu, mbu_vector


@dataclass(frozen=True)
class Measured:
    """A measured time and the passes it spans, each counted `weights[i]` times (a mean
    over requests counts a pass by the share of requests it served), the requests
    admitted within it, and the bursts that found the engine idle within it (a TTFT: 1)."""

    passes: Sequence[Pass]
    seconds: float
    weights: Sequence[float] | None = None
    requests: float = 0.0
    bursts: float = 0.0


def terms(model: DecoderOnDevice, work: Pass) -> np.ndarray:
    """The columns of one pass on `model`'s device (its efficiencies taken as 1).

    On a CPU its memory and compute add; on a GPU the larger of the two is the pass's time
    (a decode step memory-bound, a long prefill compute-bound) and the other is dropped. With
    measured kernels the weights' products are their own column.
    """
    bandwidth, peak = model.peaks
    moved, flops = model.pass_work(work)
    memory, compute = moved / bandwidth, flops / peak
    if model.overlapped:
        memory, compute = (memory, 0.0) if memory >= compute else (0.0, compute)
    row = np.zeros(8)
    row[VECTOR if work.tokens == 1 else MATRIX] = memory
    row[COMPUTE] = compute
    row[PER_SEQUENCE] = work.sequences
    row[PER_LAYER] = model.shape.layers
    row[KERNEL] = model.kernels.seconds(work) if model.kernels is not None else 0.0
    return row


def fit(
    model: DecoderOnDevice,
    measured: Sequence[tuple[DecoderOnDevice, Measured]],
    vector: bool = True,
    host: Sequence[int] = _HOST,
) -> Efficiency:
    """The efficiencies whose times best match `measured` (each a model and what it took).

    Least squares on relative errors (a short time counts as much as a long one); without
    `vector`, one-token passes read at the MBU of the others; `host` names the host columns
    fitted (the others are 0). A host column solved below 0 (host work within the noise of
    nothing) is dropped and the rest fitted again. `model` gives the device's peaks.

    With measured kernels (the models' `kernels`) their share is fitted in place of the
    weights' MBU and MFU, with the MBU of the rest of each pass's bytes (KV-cache reads, dense
    attention's copies: a large share of a batch of 16 under a mask) where the runs tell it
    (else 1: the device's bandwidth), and attention's FLOPs at the device's peak (MFU 1: a
    few percent of a pass at these contexts, too little to fit from).
    """
    rows = []
    for on, m in measured:
        weights = m.weights or [1.0] * len(m.passes)
        row = sum((w * terms(on, p) for w, p in zip(weights, m.passes, strict=True)), np.zeros(8))
        row[PER_REQUEST], row[PER_BURST] = m.requests, m.bursts
        rows.append(row / m.seconds)
    system = np.array(rows)
    ones = np.ones(len(rows))
    kernels = bool(system[:, KERNEL].any())
    if not vector or kernels:
        system[:, MATRIX] += system[:, VECTOR]
    if kernels:  # attention's FLOPs at the device's peak: what is left is to be fitted
        ones -= system[:, COMPUTE]
        columns = [KERNEL, MATRIX, *host]
    else:
        columns = [MATRIX, COMPUTE, *host] + ([VECTOR] if vector else [])
    while True:
        if np.linalg.matrix_rank(system[:, columns]) < len(columns):
            raise PlanError("the measured runs do not tell the terms apart (same batch twice?)")
        solved = np.linalg.lstsq(system[:, columns], ones, rcond=None)[0]
        found = dict(zip(columns, (float(v) for v in solved), strict=True))
        if kernels and found.get(MATRIX, 1.0) < 1:
            # Reads faster than the device's bandwidth: too few bytes beside the kernels to
            # tell their rate (per-sequence attention on short contexts); at the device's.
            columns.remove(MATRIX)
            ones -= system[:, MATRIX]
            continue
        below = [c for c in _EVERY_HOST if found.get(c, 0.0) < 0]
        if not below:
            break
        columns.remove(min(below, key=lambda c: found[c]))
    if kernels:
        return _kernel_efficiency(found, [m.seconds for _, m in measured])
    return _efficiency(found, [m.seconds for _, m in measured], *model.peaks)


def calibrate(
    model: DecoderOnDevice,
    decodes: Sequence[tuple[int, float, float]],
    prefill: tuple[int, int, float],
) -> Efficiency:
    """The efficiencies that make `model`'s times equal measured ones (one model, no host time
    per layer: a single size cannot tell it from the weights' reads).

    `decodes` holds one, two or three (batch, mean context, seconds per step), `prefill` is
    (prompt tokens, prompts, seconds). One decode step: MBU and MFU, no host time. Two (at
    different batches): the host time per token too. Three, one of them at batch 1: batch 1's
    matrix-vector MBU apart from the matrix-matrix one of the others.
    """
    if not 1 <= len(decodes) <= 3:
        raise PlanError(f"calibration takes 1 to 3 decode steps, got {len(decodes)}")
    vector = len(decodes) == 3 and any(batch == 1 for batch, _, _ in decodes)
    if len(decodes) == 3 and not vector:
        raise PlanError("three decode steps calibrate batch 1's MBU apart: one must be batch 1")
    measured = [(model, Measured([Pass.decode(b, c)], s)) for b, c, s in decodes]
    prompt, prompts, seconds = prefill
    measured.append((model, Measured([Pass.prompts(prompt, prompts)], seconds)))
    host = (PER_SEQUENCE,) if len(decodes) > 1 else ()
    return fit(model, measured, vector, host)


def _efficiency(
    solved: dict[int, float], times: list[float], bandwidth: float, peak: float
) -> Efficiency:
    """The solved inverses as an Efficiency, refused where no device could have made them."""
    inverses = [solved[MATRIX], solved[COMPUTE]] + ([solved[VECTOR]] if VECTOR in solved else [])
    if min(inverses) <= 0:
        raise PlanError(
            f"the measured times {[f'{t:.3g} s' for t in times]} fit no positive MBU, MFU and "
            "host time: measure longer prompts or batches further apart"
        )
    mbu, mfu = 1 / solved[MATRIX], 1 / solved[COMPUTE]
    vector = 1 / solved[VECTOR] if VECTOR in solved else None
    if max(mbu, mfu, vector or 0.0) > 1:
        at_one = f" / MBU at batch 1 {vector:.3g}" if vector is not None else ""
        raise AboveCeiling(
            f"calibrated MBU {mbu:.3g} / MFU {mfu:.3g}{at_one} exceed 1: the device's peaks "
            f"({bandwidth / 1e9:.3g} GB/s, {peak / 1e9:.3g} GFLOP/s) understate it",
            mbu,
            mfu,
            vector,
        )
    return Efficiency(mbu, mfu, mbu_vector=vector, **_host_times(solved))


def _kernel_efficiency(solved: dict[int, float], times: list[float]) -> Efficiency:
    """The kernels' share, the rest's MBU (where solved, else 1) and the host times; MFU 1."""
    if solved[KERNEL] <= 0:
        raise PlanError(
            f"the measured times {[f'{t:.3g} s' for t in times]} fit no positive share of the "
            "measured kernels: the host's fixed costs exceed them"
        )
    mbu = 1 / solved[MATRIX] if MATRIX in solved else 1.0
    return Efficiency(mbu, 1.0, kernel_share=1 / solved[KERNEL], **_host_times(solved))


def _host_times(solved: dict[int, float]) -> dict[str, float]:
    """The solved host columns as Efficiency's fields (0 where a column was not fitted)."""
    return {name: solved.get(column, 0.0) for column, name in _HOST_FIELDS.items()}
