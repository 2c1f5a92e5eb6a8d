"""Classify and regress on any model: which outputs answer them, and their results.

TensorFlow Serving classifies with a signature whose outputs are `classes` (strings) and
`scores`, and regresses with one whose output is `outputs`. A model that is not TensorFlow's
classifies when it has such outputs, or one floating-point output of shape [batch, classes]
(each class then named by its index); it regresses when it has an output `outputs`, or a single
output, holding one number per example. Anything else is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, InferenceResponse, ModelMetadata

_FLOATS = (Datatype.FP16, Datatype.BF16, Datatype.FP32, Datatype.FP64)
SCORES, CLASSES, OUTPUTS = "scores", "classes", "outputs"
#: One example's classes: (label, score) pairs in the model's order.
Classes = list[tuple[str, float]]


@dataclass(frozen=True)
class ClassifyPlan:
    """The outputs that classify: scores, and the labels' output if the model has one."""

    scores: str
    classes: str | None


def classify_plan(meta: ModelMetadata) -> ClassifyPlan:
    """How `meta`'s model classifies; InvalidInput saying why when it cannot."""
    outputs = {s.name: s for s in meta.outputs}
    scores = outputs.get(SCORES)
    if scores is not None and scores.datatype in _FLOATS:
        labels = outputs.get(CLASSES)
        has_labels = labels is not None and labels.datatype is Datatype.BYTES
        return ClassifyPlan(SCORES, CLASSES if has_labels else None)
    if len(meta.outputs) == 1:
        only = meta.outputs[0]
        if only.datatype in _FLOATS and len(only.shape) == 2:
            return ClassifyPlan(only.name, None)
    raise InvalidInput(
        f"model {meta.name!r} cannot classify: classify needs one floating-point output of shape "
        f"[batch, classes], or outputs {SCORES!r} (and {CLASSES!r}, strings) as a TensorFlow "
        f"classification signature has; its outputs: {_described(meta)}"
    )


def regress_output(meta: ModelMetadata) -> str:
    """The output that regresses; InvalidInput saying why when the model has none."""
    outputs = {s.name: s for s in meta.outputs}
    spec = outputs.get(OUTPUTS) or (meta.outputs[0] if len(meta.outputs) == 1 else None)
    if spec is not None and spec.datatype not in (Datatype.BYTES, Datatype.BOOL):
        row = spec.shape[1:]
        if all(d in (1, -1) for d in row) and len(row) <= 1:
            return spec.name
    raise InvalidInput(
        f"model {meta.name!r} cannot regress: regress needs an output {OUTPUTS!r}, or a single "
        f"output, of one number per example (shape [batch] or [batch, 1]); its outputs: "
        f"{_described(meta)}"
    )


def classifications(response: InferenceResponse, plan: ClassifyPlan, rows: int) -> list[Classes]:
    """Each example's classes and scores; without a labels output a class is named by its index."""
    scores = _rows(response, plan.scores, rows)
    if plan.classes is None:
        names = [str(i) for i in range(scores.shape[1])]
        return [list(zip(names, row.tolist(), strict=True)) for row in scores]
    labels = _rows(response, plan.classes, rows)
    if labels.shape != scores.shape:
        raise InvalidInput(
            f"outputs {plan.classes!r} {list(labels.shape)} and {plan.scores!r} "
            f"{list(scores.shape)} disagree: each class needs a label and a score"
        )
    return [
        [(_label(c), float(s)) for c, s in zip(classes, row, strict=True)]
        for classes, row in zip(labels, scores, strict=True)
    ]


def regressions(response: InferenceResponse, name: str, rows: int) -> list[float]:
    """Each example's value."""
    values = _rows(response, name, rows)
    if values.shape[1] != 1:
        raise InvalidInput(
            f"output {name!r} holds {values.shape[1]} values per example; regress needs one"
        )
    return [float(v) for v in values[:, 0]]


def _rows(response: InferenceResponse, name: str, rows: int) -> np.ndarray:
    array = response.outputs[name]
    if array.ndim == 0 or array.shape[0] != rows:
        raise InvalidInput(
            f"output {name!r} has shape {list(array.shape)}, not one row for each of the {rows} "
            "examples"
        )
    flat = array.reshape(rows, -1)
    return flat if flat.dtype.kind == "O" else flat.astype(np.float64)


def _label(item: object) -> str:
    return item.decode(errors="replace") if isinstance(item, bytes) else str(item)


def _described(meta: ModelMetadata) -> str:
    return ", ".join(f"{s.name!r} {s.described()}" for s in meta.outputs)
