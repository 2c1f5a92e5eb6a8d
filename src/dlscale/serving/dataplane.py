"""The DataPlane: protocol-agnostic server operations; frontends only decode and encode."""

from __future__ import annotations

import time

import numpy as np

from dlscale import __version__
from dlscale.errors import DlscaleError, InvalidInput, NotFound, Unavailable, Unsupported
from dlscale.serving.manager import ModelManager, ModelState, ServedVersion
from dlscale.serving.views import config_view
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    Parameters,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)

#: Protocol extensions both frontends implement; GET /v2 and ServerMetadata advertise them.
EXTENSIONS = (
    "binary_tensor_data",
    "schedule_policy",
    "model_repository",
    "statistics",
)


class DataPlane:
    """Validates requests against model metadata, routes them to batchers, records outcomes."""

    def __init__(self, manager: ModelManager, model_control: str = "none") -> None:
        if model_control not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control {model_control!r}: expected none, explicit or poll")
        self.manager = manager
        self.model_control = model_control
        self._accepting = True

    # -- health and metadata --------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready while accepting requests and every model asked for is loaded."""
        if not self._accepting:
            return False
        return all(e.state is not ModelState.LOADING for e in self.manager.entries())

    def stop_accepting(self) -> None:
        """Shutdown has begun: new requests are refused; those in flight finish."""
        self._accepting = False

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("dlscale", __version__, EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.manager.get(name, version)
        except DlscaleError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self.manager.get(name, version)
        entry = next(e for e in self.manager.entries() if e.name == name)
        return ModelMetadata(
            name=name,
            versions=tuple(str(v) for v in sorted(entry.versions)),
            platform=served.config.platform_name,
            inputs=tuple(served.inputs),
            outputs=tuple(served.outputs),
        )

    def model_config(self, name: str, version: str = "") -> ModelConfigView:
        """The config a model is served with, as the protocol shows it (Triton's layout)."""
        return config_view(self.manager.get(name, version))

    def single_input(self, name: str, version: str = "") -> tuple[TensorSpec, bool]:
        """The one input of a single-input model, and whether the model batches."""
        served = self.manager.get(name, version)
        if len(served.inputs) != 1:
            raise InvalidInput(
                f"the raw binary form (Inference-Header-Content-Length: 0) needs a model with one "
                f"input; model {name!r} has {[s.name for s in served.inputs]}"
            )
        return served.inputs[0], served.config.batched

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Validate, queue, wait, and answer one request; every outcome is counted."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        _check_schedule_parameters(request.parameters)
        start = time.perf_counter_ns()
        served = self.manager.get(request.model_name, request.model_version)
        try:
            wanted = self._validate(served, request)
            outputs = await served.batcher.infer(
                request.inputs, request.priority, request.timeout_us
            )
        except DlscaleError as exc:
            served.stats.record_failure(exc.reason, time.perf_counter_ns() - start)
            raise
        total = time.perf_counter_ns() - start
        served.stats.record_success(total)
        return InferenceResponse(
            model_name=request.model_name,
            model_version=str(served.version.version),
            id=request.id,
            outputs={n: outputs[n] for n in wanted},
        )

    def _validate(self, served: ServedVersion, request: InferenceRequest) -> list[str]:
        """Check names, datatypes, shapes and batch size; return the output names to send."""
        model = served.version.name
        config = served.config
        expected = {s.name: s for s in served.inputs}
        missing = [n for n in expected if n not in request.inputs]
        if missing:
            raise InvalidInput(
                f"model {model!r} expects inputs {sorted(expected)}; the request lacks {missing}"
            )
        extra = [n for n in request.inputs if n not in expected]
        if extra:
            raise InvalidInput(
                f"unexpected inputs {extra} for model {model!r} (it takes {sorted(expected)})"
            )
        batches = set()
        for name, array in request.inputs.items():
            _check_input(model, expected[name], array)
            if config.batched:
                batches.add(array.shape[0])
        if config.batched:
            if len(batches) > 1:
                raise InvalidInput(
                    f"inputs of model {model!r} disagree on the batch size: {sorted(batches)}"
                )
            batch = batches.pop()
            if batch > config.max_batch_size:
                raise InvalidInput(
                    f"batch size {batch} exceeds max_batch_size {config.max_batch_size} of "
                    f"model {model!r}"
                )
            if batch == 0:
                raise InvalidInput(f"batch size 0 for model {model!r}: send at least one row")
        names = [s.name for s in served.outputs]
        if request.outputs is None:
            return names
        unknown = [o.name for o in request.outputs if o.name not in names]
        if unknown:
            raise InvalidInput(
                f"unknown outputs {unknown} requested from model {model!r} (it has {names})"
            )
        return [o.name for o in request.outputs]

    # -- repository and statistics ----------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every model in the repository with its state, one row per served version."""
        known = {e.name: e for e in self.manager.entries()}
        index: list[RepositoryEntry] = []
        for name in self.manager.repository.names():
            entry = known.get(name)
            state = entry.state.value if entry else "UNAVAILABLE"
            reason = entry.reason if entry else "not loaded"
            if ready_only and state != "READY":
                continue
            versions = [str(v) for v in sorted(entry.versions)] if entry else []
            index.extend(RepositoryEntry(name, state, reason, v) for v in versions or [""])
        return index

    async def load_model(self, name: str) -> None:
        self._check_control()
        if name not in self.manager.repository.names():
            raise NotFound(f"no model {name!r} in the repository {self.manager.repository.root}")
        await self.manager.load(name)

    async def unload_model(self, name: str) -> None:
        self._check_control()
        await self.manager.unload(name)

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Triton's statistics extension: one entry per served version."""
        if name:
            served = [self.manager.get(name, version)]
        else:
            served = [v for e in self.manager.entries() for v in e.versions.values()]
        return [s.stats.snapshot() for s in served]

    def _check_control(self) -> None:
        if self.model_control == "none":
            raise Unsupported(
                "the server was started with --model-control none: models cannot be loaded or "
                "unloaded through the API (start it with --model-control explicit)"
            )


def _check_schedule_parameters(params: Parameters) -> None:
    """`priority` and `timeout` are non-negative integers, whichever protocol carried them."""
    for key in ("priority", "timeout"):
        value = params.get(key)
        if value is None:
            continue
        # Not bool (an int subclass), string or float: 2.0, inf or nan are refused alike.
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"parameter {key!r} must be a non-negative integer, got {value!r}"
                + (" (microseconds)" if key == "timeout" else "")
            )


def _check_input(model: str, spec: TensorSpec, array: np.ndarray) -> None:
    got = Datatype.from_numpy(array.dtype)
    if got is not spec.datatype:
        raise InvalidInput(
            f"input {spec.name!r} of model {model!r} has datatype {spec.datatype.value}; the "
            f"request gave {got.value}"
        )
    if not spec.matches(array.shape):
        raise InvalidInput(
            f"input {spec.name!r} of model {model!r} has shape {list(spec.shape)}; the request "
            f"gave {list(array.shape)}"
        )
