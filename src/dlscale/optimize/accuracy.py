"""The accuracy guard: a variant's outputs on the validation set against the FP32 reference."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlscale.backends import Backend
from dlscale.errors import OptimizeError

Arrays = dict[str, np.ndarray]


class Metric(enum.StrEnum):
    """How a variant is compared with the reference; each gives a deviation, 0 at best."""

    #: Task accuracy against labels: deviation = reference top-1 minus variant top-1.
    TOP1 = "top1"
    #: Share of samples whose top-1 class differs from the reference's.
    AGREEMENT = "agreement"
    #: 1 minus the mean per-sample cosine similarity (worst output).
    COSINE = "cosine"
    #: Largest absolute error divided by the reference's largest magnitude (worst output).
    MAXABS = "maxabs"


def choose_metric(
    requested: str, *, has_labels: bool, outputs: Mapping[str, np.ndarray], task: str = ""
) -> Metric:
    """The metric to judge by: the one asked for, else top1 with labels, agreement for
    classifiers, cosine for anything else."""
    if requested not in ("", "auto"):
        try:
            metric = Metric(requested)
        except ValueError:
            choices = ", ".join(m.value for m in Metric)
            raise OptimizeError(
                f"metric {requested!r}: expected auto or one of {choices}"
            ) from None
        if metric is Metric.TOP1 and not has_labels:
            raise OptimizeError(
                "metric top1 needs labels (a 'labels' array in the model's validation.npz); "
                "use agreement, cosine or maxabs"
            )
        if metric in (Metric.TOP1, Metric.AGREEMENT) and not _classifier(outputs):
            raise OptimizeError(
                f"metric {metric.value} needs one 2-D output of class scores; "
                f"this model gives { {k: list(v.shape) for k, v in outputs.items()} }"
            )
        return metric
    if has_labels and _classifier(outputs):
        return Metric.TOP1
    if task == "classification" or (_classifier(outputs) and task == ""):
        return Metric.AGREEMENT
    return Metric.COSINE


def _classifier(outputs: Mapping[str, np.ndarray]) -> bool:
    return len(outputs) == 1 and all(a.ndim == 2 and a.shape[1] > 1 for a in outputs.values())


@dataclass(frozen=True)
class AccuracyCheck:
    """The guard's verdict on one variant."""

    metric: Metric
    #: The metric's value for the reference (top-1 accuracy) or None when it is relative.
    reference_value: float | None
    #: The variant's value: top-1 accuracy, agreement, mean cosine or relative max error.
    value: float
    #: How far the variant is from the reference (0 is identical); compared with the tolerance.
    deviation: float
    tolerance: float
    samples: int

    @property
    def accepted(self) -> bool:
        return self.deviation <= self.tolerance

    @property
    def excess(self) -> float:
        """By how much the deviation exceeds the tolerance (0 when accepted)."""
        return max(0.0, self.deviation - self.tolerance)

    def describe(self) -> str:
        """One line for the report: the value, the deviation and the verdict."""
        if self.metric is Metric.TOP1:
            what = f"top-1 {self.value:.2%} vs FP32 {self.reference_value or 0:.2%}"
        elif self.metric is Metric.AGREEMENT:
            what = f"top-1 agreement {self.value:.2%}"
        elif self.metric is Metric.COSINE:
            what = f"mean cosine {self.value:.6f}"
        else:
            what = f"max abs error {self.value:.3%} of the largest reference value"
        verdict = (
            f"within the {self.tolerance:.2%} tolerance"
            if self.accepted
            else f"beyond the {self.tolerance:.2%} tolerance by {self.excess:.2%}"
        )
        return f"{what}; deviation {self.deviation:.2%}, {verdict} ({self.samples} samples)"

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the report."""
        return {
            "metric": self.metric.value,
            "reference_value": self.reference_value,
            "value": self.value,
            "deviation": self.deviation,
            "tolerance": self.tolerance,
            "excess": self.excess,
            "accepted": self.accepted,
            "samples": self.samples,
        }


def run_outputs(backend: Backend, inputs: Mapping[str, np.ndarray], batch: int) -> Arrays:
    """Every output for the whole set, computed `batch` rows at a time, as FP32."""
    dtypes = {spec.name: spec.datatype.numpy for spec in backend.inputs}
    missing = sorted(set(dtypes) - set(inputs))
    if missing:
        raise OptimizeError(f"the validation set lacks inputs {missing} (has {sorted(inputs)})")
    rows = len(next(iter(inputs.values())))
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, rows, max(1, batch)):
        feed = {
            n: np.ascontiguousarray(inputs[n][start : start + batch], dt)
            for n, dt in dtypes.items()
        }
        for name, value in backend.infer(feed).items():
            parts.setdefault(name, []).append(np.asarray(value, dtype=np.float32))
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def compare(
    metric: Metric,
    reference: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    tolerance: float,
    labels: np.ndarray | None = None,
) -> AccuracyCheck:
    """Judge a variant's outputs against the reference's on the same inputs."""
    if set(reference) != set(outputs):
        raise OptimizeError(
            f"outputs differ: reference {sorted(reference)}, variant {sorted(outputs)}"
        )
    ref, got = next(iter(reference.values())), next(iter(outputs.values()))
    samples = len(ref)
    if metric is Metric.TOP1:
        if labels is None:
            raise OptimizeError("metric top1 needs labels")
        ref_acc, acc = _top1(ref, labels), _top1(got, labels)
        return AccuracyCheck(metric, ref_acc, acc, max(0.0, ref_acc - acc), tolerance, samples)
    if metric is Metric.AGREEMENT:
        agree = float(np.mean(ref.argmax(1) == got.argmax(1)))
        return AccuracyCheck(metric, None, agree, 1.0 - agree, tolerance, samples)
    if metric is Metric.COSINE:
        worst = min(_mean_cosine(reference[n], outputs[n]) for n in reference)
        return AccuracyCheck(metric, None, worst, max(0.0, 1.0 - worst), tolerance, samples)
    worst = max(_relative_maxabs(reference[n], outputs[n]) for n in reference)
    return AccuracyCheck(metric, None, worst, worst, tolerance, samples)


def _top1(scores: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(scores.argmax(1) == labels.reshape(-1)))


def _mean_cosine(ref: np.ndarray, got: np.ndarray) -> float:
    a = ref.reshape(len(ref), -1).astype(np.float64)
    b = got.reshape(len(got), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    # Two all-zero rows agree perfectly; one zero row against a non-zero one not at all.
    same = np.where(
        norms > 0,
        (a * b).sum(1) / np.where(norms > 0, norms, 1),
        np.all(a == b, axis=1).astype(np.float64),
    )
    return float(np.mean(same))


def _relative_maxabs(ref: np.ndarray, got: np.ndarray) -> float:
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(ref.astype(np.float64) - got))) / scale
