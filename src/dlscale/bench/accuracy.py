"""Accuracy mode: every response of an AccuracyOnly run checked against labels or a reference."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench.data import SampleSet
from dlscale.errors import BenchError

#: MLPerf's closed-division rule: an optimized model keeps at least 99% of the reference.
MIN_FRACTION = 0.99
KEPT_MISMATCHES = 5


@dataclass
class AccuracyResult:
    """How the responses compared: counts, the fraction that passed, the first mismatches."""

    method: str
    samples: int
    checked: int
    passed: int
    fraction: float
    #: Top-1 against labels, or top-1 agreement with the reference, when outputs are scores.
    top1: float | None = None
    max_abs_error: float | None = None
    ok: bool | None = None
    mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return asdict(self)


def check_labels(samples: SampleSet, outputs: dict[int, dict[str, np.ndarray]]) -> AccuracyResult:
    """Top-1 of the first output against the samples' labels (e.g. digits' validation.npz); it
    says how many agree and judges nothing (`ok` stays None)."""
    if samples.labels is None:
        raise BenchError("the samples carry no labels")
    labels = np.asarray(samples.labels).reshape(len(samples), -1)[:, 0]
    hits, mismatches = 0, list[str]()
    for index, outs in sorted(outputs.items()):
        predicted = int(np.argmax(next(iter(outs.values())).reshape(-1)))
        if predicted == int(labels[index]):
            hits += 1
        else:
            _keep(mismatches, f"sample {index}: predicted {predicted}, label {int(labels[index])}")
    top1 = hits / len(samples)
    return AccuracyResult(
        method="top-1 against labels",
        samples=len(samples),
        checked=len(outputs),
        passed=hits,
        fraction=top1,
        top1=top1,
        mismatches=mismatches,
    )


def reference_outputs(
    model_file: Path, samples: SampleSet, batched: bool
) -> list[dict[str, np.ndarray]]:
    """Each sample's outputs from the FP32 model file, computed here with ONNX Runtime (CPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime raises its own untyped errors
        raise BenchError(f"reference model {model_file} cannot be loaded: {exc}") from None
    names = [o.name for o in session.get_outputs()]
    results: list[dict[str, np.ndarray]] = []
    step = 64 if batched else 1
    for start in range(0, len(samples), step):
        idx = list(range(start, min(start + step, len(samples))))
        feed = samples.request(batched, idx)
        values = session.run(names, feed)
        if batched:
            results.extend(
                {n: v[i] for n, v in zip(names, values, strict=True)} for i in range(len(idx))
            )
        else:
            results.append(dict(zip(names, values, strict=True)))
    return results


def check_reference(
    reference: list[dict[str, np.ndarray]],
    outputs: dict[int, dict[str, np.ndarray]],
    source: str,
    rtol: float = 1e-2,
    atol: float = 1e-3,
) -> AccuracyResult:
    """Each response against the reference's outputs for the same sample, within tolerance."""
    passed, agree, scored, worst = 0, 0, 0, 0.0
    mismatches: list[str] = []
    for index, outs in sorted(outputs.items()):
        want = reference[index]
        ok = True
        for name, expected in want.items():
            got = outs.get(name)
            if got is None or got.shape != expected.shape:
                ok = False
                detail = "missing" if got is None else f"shape {list(got.shape)}"
                _keep(mismatches, f"sample {index}: output {name!r} {detail}")
                continue
            if expected.dtype.kind == "f":
                err = float(np.max(np.abs(got.astype(np.float64) - expected), initial=0.0))
                worst = max(worst, err)
                close = bool(np.allclose(got, expected, rtol=rtol, atol=atol))
                if expected.ndim >= 1 and expected.size > 1:
                    scored += 1
                    agree += int(np.argmax(got) == np.argmax(expected))
            else:
                err, close = 0.0, bool(np.array_equal(got, expected))
            if not close:
                ok = False
                _keep(
                    mismatches, f"sample {index}: output {name!r} differs (max |error| {err:.3g})"
                )
        passed += ok
    fraction = passed / len(reference) if reference else 0.0
    return AccuracyResult(
        method=f"against the reference {source} (rtol {rtol:g}, atol {atol:g})",
        samples=len(reference),
        checked=len(outputs),
        passed=passed,
        fraction=fraction,
        top1=agree / scored if scored else None,
        max_abs_error=worst,
        ok=fraction >= MIN_FRACTION,
        mismatches=mismatches,
    )


def _keep(mismatches: list[str], text: str) -> None:
    if len(mismatches) < KEPT_MISMATCHES:
        mismatches.append(text)
