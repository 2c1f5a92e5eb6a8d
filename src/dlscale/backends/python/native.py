"""dlscale's own Python-model API: a class `Model` with `load(context)`, batched `infer`, `unload`.

The server merges requests into one batch as for any backend; `infer` gets the batch's named
arrays (batch first when max_batch_size > 0) and returns the outputs by name.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.backends.base import RequestResult, StreamPart
from dlscale.backends.python.binding import current_caller
from dlscale.backends.python.loader import UserCodeError, UserModel, failure, user_class
from dlscale.backends.python.streaming import Channel
from dlscale.errors import DlscaleError, Unavailable
from dlscale.types import InferenceRequest, TensorSpec

log = logging.getLogger("dlscale.python")


@dataclass(frozen=True)
class ModelContext:
    """What `Model.load` is told: the model, its folder, device, tensors and parameters."""

    name: str
    version: int
    folder: Path  # the version folder that holds model.py (and any files the model reads)
    device: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: Mapping[str, Any]

    def call(
        self, model: str, inputs: Mapping[str, np.ndarray], version: str = ""
    ) -> dict[str, np.ndarray]:
        """Infer with another model of the same server (from `infer` only); raises its error."""
        caller = current_caller()
        if caller is None:
            raise Unavailable(f"model {self.name!r}: calling models needs a running server")
        request = InferenceRequest(model_name=model, inputs=dict(inputs), model_version=version)
        return caller.infer(request).outputs


class NativeRunner:
    """Runs a `Model` class: loaded once, then one merged batch per call."""

    def __init__(self, model: UserModel) -> None:
        self.model = model
        self._user = user_class(model, "native")()
        context = ModelContext(
            model.name,
            model.version,
            model.path.parent,
            model.device,
            model.max_batch_size,
            model.inputs,
            model.outputs,
            dict(model.parameters),
        )
        load = getattr(self._user, "load", None)
        if load is not None:
            try:
                load(context)
            except Exception as exc:
                raise failure(model, "load", exc) from None

    #: dlscale's `Model` API has no readiness of its own: loaded is ready.
    checks_ready = False

    def ready(self) -> bool:
        """Always: see `checks_ready`."""
        return True

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """`infer` on each batch given (the batcher merged each already); raises for user bugs."""
        return [self._infer(inputs) for inputs in requests]

    def _infer(self, inputs: Mapping[str, np.ndarray]) -> RequestResult:
        try:
            outputs = self._user.infer(dict(inputs))
        except DlscaleError:
            raise  # the user chose the error (InvalidInput: a 400 for the batch)
        except Exception as exc:
            raise failure(self.model, "infer", exc) from None
        return self._arrays("infer returned", outputs)

    def stream(
        self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any], channel: Channel
    ) -> None:
        """`stream(inputs)` (or `stream(inputs, parameters)`: the request's parameters): each
        dict it yields is one response, then the final flag; closed at its next yield once the
        client left."""
        try:
            method = self._user.stream
            takes = len(inspect.signature(method).parameters)
            generator = (
                method(dict(inputs), dict(parameters)) if takes > 1 else method(dict(inputs))
            )
            for outputs in generator:
                if channel.cancelled.is_set():
                    generator.close()
                    return
                channel.send(StreamPart(self._arrays("stream yielded", outputs)))
        except DlscaleError:
            raise  # the user chose the error; it ends the stream
        except Exception as exc:
            raise failure(self.model, "stream", exc) from None
        channel.send(StreamPart({}, final=True))

    def _arrays(self, what: str, outputs: Any) -> dict[str, np.ndarray]:
        if not isinstance(outputs, Mapping):
            raise UserCodeError(
                f"model {self.model.name!r}: {what} {type(outputs).__name__}; "
                "expected a dict of numpy arrays by output name"
            )
        return {str(k): np.asarray(v) for k, v in outputs.items()}

    def close(self) -> None:
        """Call the model's `unload`, if it has one; a failure is logged, not raised."""
        unload = getattr(self._user, "unload", None)
        if unload is not None:
            try:
                unload()
            except Exception:
                log.exception("model %r: unload raised", self.model.name)
