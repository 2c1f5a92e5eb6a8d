"""An engine's efficiencies from its measured step times: MBU, MFU, host time per token, and
the share of bandwidth of a batch-1 step's matrix-vector products (docs/plan.md, "Checked
against measured runs")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlscale.errors import PlanError
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency


class AboveCeiling(PlanError):
    """Measured times faster than the device's figures allow: the shares the fit found."""

    def __init__(self, message: str, mbu: float, mfu: float, mbu_vector: float | None) -> None:
        super().__init__(message)
        self.mbu, self.mfu, self.mbu_vector = mbu, mfu, mbu_vector


def calibrate(
    model: DecoderOnDevice,
    decodes: Sequence[tuple[int, float, float]],
    prefill: tuple[int, int, float],
) -> Efficiency:
    """The efficiencies that make `model`'s times equal measured ones.

    `decodes` holds one, two or three (batch, mean context, seconds per step), `prefill` is
    (prompt tokens, prompts, seconds). Each time is bytes / bandwidth x (1 / MBU) + FLOPs /
    peak x (1 / MFU) + tokens x host on a CPU; on a GPU the decode steps are taken as
    memory-bound and the prefill as compute-bound (their other term dropped). One decode step:
    MBU and MFU, no host time. Two (at different batches): the host time too. Three, one of
    them at batch 1: batch 1's matrix-vector MBU apart from the matrix-matrix one of the others.
    A host time solved below 0 is taken as 0 (the rest fitted by least squares).
    """
    if not 1 <= len(decodes) <= 3:
        raise PlanError(f"calibration takes 1 to 3 decode steps, got {len(decodes)}")
    vector = len(decodes) == 3 and any(batch == 1 for batch, _, _ in decodes)
    if len(decodes) == 3 and not vector:
        raise PlanError("three decode steps calibrate batch 1's MBU apart: one must be batch 1")
    bandwidth = model.bandwidth / model.efficiency.mbu  # the device's peaks
    peak = model.compute / model.efficiency.mfu
    both = not model.overlapped
    rows, times = [], []
    # Columns: 1 / MBU of a one-token pass, 1 / MBU, 1 / MFU, host seconds per token.
    for batch, context, seconds in decodes:
        moved, flops = model.decode_work(batch, context)
        alone = vector and batch == 1
        memory = moved / bandwidth
        rows.append([memory if alone else 0.0, 0.0 if alone else memory, flops / peak, batch])
        if not both:
            rows[-1][2] = 0.0
        times.append(seconds)
    moved, flops = model.prefill_work(prefill[0], prefill[1])
    rows.append([0.0, moved / bandwidth if both else 0.0, flops / peak, prefill[1]])
    times.append(prefill[2])
    columns = [1, 2] + ([3] if len(decodes) > 1 else []) + ([0] if vector else [])
    system = np.array(rows)[:, columns]
    try:
        solved = dict(zip(columns, np.linalg.solve(system, np.array(times)), strict=True))
    except np.linalg.LinAlgError:
        raise PlanError(
            "the measured runs do not tell the terms apart (same batch twice?)"
        ) from None
    if solved.get(3, 0.0) < 0:
        # An engine whose host work per token is within the noise of nothing: the host time
        # is 0, and the other figures the least-squares fit of the same equations without it.
        columns.remove(3)
        fit = np.linalg.lstsq(np.array(rows)[:, columns], np.array(times), rcond=None)[0]
        solved = dict(zip(columns, fit, strict=True))
    return _efficiency(solved, times, bandwidth, peak)


def _efficiency(
    solved: dict[int, float], times: list[float], bandwidth: float, peak: float
) -> Efficiency:
    """The solved inverses as an Efficiency, refused where no device could have made them."""
    inverses = [solved[1], solved[2]] + ([solved[0]] if 0 in solved else [])
    host = solved.get(3, 0.0)
    if min(inverses) <= 0 or host < 0:
        raise PlanError(
            f"the measured times {[f'{t:.3g} s' for t in times]} fit no positive MBU, MFU and "
            "host time: measure longer prompts or batches further apart"
        )
    mbu, mfu = 1 / solved[1], 1 / solved[2]
    vector = 1 / solved[0] if 0 in solved else None
    if max(mbu, mfu, vector or 0.0) > 1:
        at_one = f" / MBU at batch 1 {vector:.3g}" if vector is not None else ""
        raise AboveCeiling(
            f"calibrated MBU {mbu:.3g} / MFU {mfu:.3g}{at_one} exceed 1: the device's peaks "
            f"({bandwidth / 1e9:.3g} GB/s, {peak / 1e9:.3g} GFLOP/s) understate it",
            mbu,
            mfu,
            vector,
        )
    return Efficiency(mbu, mfu, float(host), vector)
