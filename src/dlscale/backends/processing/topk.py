"""The top-k step: a batch of scores (logits, probabilities) in, each row's k best classes out.

Outputs, as the config asks for them: `labels`, BYTES [k] in Triton's classification format
"score:index:label" (written by wire/classification.py, the same code that answers Triton's
classification extension), and `indices`, INT64 [k], highest score first. The labels file
(one label per line) sits in the version folder beside the `model.topk` marker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from pydantic import Field

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.backends.confined import read_confined
from dlscale.backends.processing.options import StepOptions, read_options
from dlscale.backends.processing.step import Step
from dlscale.errors import ConfigError, InvalidInput
from dlscale.types import Datatype, TensorSpec
from dlscale.wire.classification import MAX_LABEL_BYTES, parse_labels, top_classes

#: Score datatypes the step takes.
SCORES = (Datatype.FP32, Datatype.FP16, Datatype.FP64, Datatype.INT32, Datatype.INT64)
#: What a batch may cost to run on the event loop (`Capabilities.inline_rows`), in scores
#: sorted: a row costs its classes plus ~400 for its k strings (measured on a 2-vCPU EPYC: 1 row
#: of 10 classes 9 us, 8 rows 37 us; 2 rows of 1000 classes 34 us), so ~0.1 ms at most.
INLINE_BUDGET = 4000
ROW_COST = 400


class TopKOptions(StepOptions):
    """The top-k step's [backend_options] (docs/processing.md)."""

    k: int = Field(5, ge=1, le=1000)
    #: The labels file in the version folder ("": indices only, labels are "score:index").
    labels: str = "labels.txt"


class TopKBackend(Step):
    """Each row's k highest scores, as Triton's classification strings and as indices."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        super().__init__(path, options)
        self.settings = read_options(TopKOptions, options.extra, "topk")
        self.k = self.settings.k
        self.inputs = self._scores(options.inputs)
        self.outputs = self._answers(options.outputs)
        self.labels: tuple[str, ...] = ()

    def _scores(self, declared: tuple[TensorSpec, ...]) -> list[TensorSpec]:
        if not declared:
            return [TensorSpec("scores", Datatype.FP32, (-1, -1))]
        if len(declared) != 1 or declared[0].datatype not in SCORES or len(declared[0].shape) != 2:
            raise ConfigError(
                "topk step: declare one input of scores, [classes] per row, of "
                f"{[d.value for d in SCORES]}; got {[(s.name, s.datatype.value) for s in declared]}"
            )
        classes = declared[0].shape[1]
        if 0 < classes < self.k:
            raise ConfigError(f"topk step: k = {self.k} is more than the {classes} scores per row")
        return list(declared)

    def _answers(self, declared: tuple[TensorSpec, ...]) -> list[TensorSpec]:
        made = {
            Datatype.BYTES: TensorSpec("labels", Datatype.BYTES, (-1, self.k)),
            Datatype.INT64: TensorSpec("indices", Datatype.INT64, (-1, self.k)),
        }
        if not declared:
            return list(made.values())
        bound = []
        for spec in declared:
            mine = made.pop(spec.datatype, None)
            if mine is None or spec.shape not in ((-1, self.k), (-1, -1)):
                raise ConfigError(
                    f"topk step: output {spec.name!r} is {spec.datatype.value} "
                    f"{list(spec.shape[1:])}; outputs are BYTES [{self.k}] (labels) and/or "
                    f"INT64 [{self.k}] (indices), one of each at most"
                )
            bound.append(TensorSpec(spec.name, mine.datatype, mine.shape))
        return bound

    def load(self) -> None:
        self._needs_rows("topk", "score rows")
        name = self.settings.labels
        if name:
            data = read_confined(self.path.parent, name, MAX_LABEL_BYTES, "topk labels file")
            self.labels = parse_labels(data)

    @property
    def capabilities(self) -> Capabilities:
        # Small batches of a known number of classes run on the event loop (base.py says
        # why); scores of undeclared width could be any size, so they always go to the thread.
        classes = self.inputs[0].shape[1]
        inline = INLINE_BUDGET // (ROW_COST + classes) if classes > 0 else 0
        return Capabilities(inline_rows=inline)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        name = self.inputs[0].name
        scores = np.asarray(inputs[name])
        if scores.ndim != 2 or scores.shape[1] < self.k:
            raise InvalidInput(
                f"input {name!r} has shape {list(scores.shape)}: the topk step needs at least "
                f"k = {self.k} scores per row"
            )
        out: dict[str, np.ndarray] = {}
        for spec in self.outputs:
            if spec.datatype is Datatype.BYTES:
                out[spec.name] = top_classes(scores, self.k, self.labels, True, name)
            else:
                order = np.argsort(-scores.astype(np.float64), axis=1, kind="stable")
                out[spec.name] = order[:, : self.k].astype(np.int64)
        return out

    def unload(self) -> None:
        self.labels = ()
