"""The DataPlane: protocol-agnostic server operations; frontends only decode and encode."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dlscale import __version__
from dlscale.errors import (
    DlscaleError,
    InvalidInput,
    NotFound,
    Unavailable,
    Unsupported,
    redact_paths,
)
from dlscale.serving.batcher import Tensors
from dlscale.serving.classification import class_count, top_classes
from dlscale.serving.control.uploads import Uploads
from dlscale.serving.control.views import config_view
from dlscale.serving.manager import ModelManager, ServedVersion
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.trace import Tracer
from dlscale.serving.regions import cuda as cuda_memory
from dlscale.serving.regions.registry import Lease, SharedMemoryRegistry
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    Parameters,
    RegionTensor,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)

log = logging.getLogger("dlscale.models")

#: Protocol extensions both frontends implement; GET /v2 and ServerMetadata advertise them.
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "schedule_policy",
    "model_configuration",
    "model_repository",
    "statistics",
    "trace",
    "logging",
)


class DataPlane:
    """Validates requests against model metadata, routes them to batchers, records outcomes."""

    def __init__(
        self,
        manager: ModelManager,
        model_control: str = "none",
        shared_memory: SharedMemoryRegistry | None = None,
        tracer: Tracer | None = None,
        logs: LogControl | None = None,
        strict_readiness: bool = True,
    ) -> None:
        if model_control not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control {model_control!r}: expected none, explicit or poll")
        self.manager = manager
        self.model_control = model_control
        self.strict_readiness = strict_readiness
        #: The shared-memory regions requests may name (off unless the server allows them).
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.tracer = tracer or Tracer()
        self.logs = logs or LogControl()
        self.uploads = Uploads()
        self._accepting = True
        self._started = False  # the models asked for at start have each been tried
        self._inflight: set[asyncio.Future[Tensors]] = set()

    # -- health and metadata --------------------------------------------------------------------

    def live(self) -> bool:
        """Live from the moment a frontend answers, while models load too."""
        return True

    def ready(self) -> bool:
        """Ready once the start's models were tried, while accepting requests, and (strict, as
        Triton's --strict-readiness) while every model the server should serve is READY."""
        if not self._accepting or not self._started:
            return False
        return not self.strict_readiness or self.manager.required_ready()

    async def load_initial(self, names: Sequence[str] | None = None) -> dict[str, DlscaleError]:
        """Load the models the server starts with (default: every one); the failed come back.

        A model that fails is UNAVAILABLE with its reason in the index, logged at ERROR, and
        keeps the server not ready under strict readiness; the others load and serve.
        """
        wanted = self.manager.repository.names() if names is None else list(names)
        self.manager.expect(wanted)
        try:
            return await self.manager.load_all(wanted)
        finally:
            self._started = True

    def stop_accepting(self) -> None:
        """Shutdown has begun: new requests are refused; those in flight finish."""
        self._accepting = False

    def cut(self, grace_s: float) -> None:
        """The shutdown grace is over: every request still waiting is answered Unavailable."""
        error = Unavailable(
            f"the server stopped before this request finished, after a grace of {grace_s:g} s"
        )
        for future in list(self._inflight):
            if not future.done():
                future.set_exception(error)

    def server_metadata(self) -> ServerMetadata:
        extensions: tuple[str, ...] = EXTENSIONS
        if self.shared_memory.enabled:
            extensions += ("system_shared_memory",)
        if self.shared_memory.cuda_ready:
            extensions += ("cuda_shared_memory",)
        return ServerMetadata("dlscale", __version__, extensions)

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

    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None:
        """The refusal a request to this model meets now by its [qos] admission, or None.

        The REST frontend asks before it reads a request's body, so that a flood the model
        refuses costs no body read or decode; a refusal is counted as `infer` counts it.
        """
        try:
            served = self.manager.get(name, version)
        except DlscaleError:
            return None  # the request itself is answered with what is wrong
        refusal = served.batcher.refuse_early()
        if refusal is not None:
            served.stats.record_failure(refusal.reason, 0)
        return refusal

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Validate, queue, wait, and answer one request; every outcome is counted."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        _check_schedule_parameters(request.parameters)
        times = RequestTimes(request_start=time.perf_counter_ns())
        served = self.manager.get(request.model_name, request.model_version)
        trace = self.tracer.start(served.version.name, served.version.version, request.id)
        lease = self.shared_memory.lease() if _names_regions(request) else None
        try:
            if lease is not None:
                _resolve(served, request, lease)
            wanted = self._validate(served, request)
            future = _submit(served, request, lease, times)
            self._inflight.add(future)  # answered Unavailable if still running at the grace's end
            future.add_done_callback(self._inflight.discard)
            outputs = await future
            placed = _place(request, outputs, lease) if lease is not None else {}
            answer = {
                n: self._answer(served, _host(outputs[n]), n, k)
                for n, k in wanted.items()
                if n not in placed
            }
        except DlscaleError as exc:
            times.request_end = time.perf_counter_ns()
            served.stats.record_failure(exc.reason, times.request_end - times.request_start)
            if trace is not None:
                self.tracer.finish(trace, times)
            raise
        finally:
            if lease is not None:
                lease.release()
        times.request_end = time.perf_counter_ns()
        served.stats.record_success(times, _rows(served, request))
        if trace is not None:
            self.tracer.finish(trace, times)
        return InferenceResponse(
            model_name=request.model_name,
            model_version=str(served.version.version),
            id=request.id,
            outputs=answer,
            in_regions=placed,
        )

    @staticmethod
    def _answer(served: ServedVersion, array: np.ndarray, name: str, classes: int) -> np.ndarray:
        """An output as computed, or its top classes when the request asked for them."""
        if not classes:
            return array
        labels = served.labels.get(name, ())
        return top_classes(array, classes, labels, served.config.batched, name)

    def _validate(self, served: ServedVersion, request: InferenceRequest) -> dict[str, int]:
        """Check names, datatypes, shapes and batch size; return the outputs to send, each with
        the number of classes asked for (0: the tensor itself)."""
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
            return dict.fromkeys(names, 0)
        unknown = [o.name for o in request.outputs if o.name not in names]
        if unknown:
            raise InvalidInput(
                f"unknown outputs {unknown} requested from model {model!r} (it has {names})"
            )
        return {o.name: class_count(o) for o in request.outputs}

    # -- repository and statistics ----------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every model in the repository with its state, one row per served version."""
        known = {e.name: e for e in self.manager.entries()}
        index: list[RepositoryEntry] = []
        names = sorted({*self.manager.repository.names(), *self.uploads.names()})
        for name in names:
            entry = known.get(name)
            state = entry.state.value if entry else "UNAVAILABLE"
            reason = redact_paths(entry.reason) if entry else "not loaded"
            if ready_only and state != "READY":
                continue
            versions = [str(v) for v in sorted(entry.versions)] if entry else []
            index.extend(RepositoryEntry(name, state, reason, v) for v in versions or [""])
        return index

    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None:
        """Load or reload a model, from the repository or with a load request's overrides:
        `config` (JSON ModelConfig) and `file:<version>/<name>` (bytes)."""
        self._check_control()
        override = self.uploads.override(name, parameters or {})
        source, files = override or (None, None)
        if files is None and name not in self.manager.repository.names():
            raise NotFound(f"no model {name!r} in the repository")
        try:
            await self.manager.load(name, source, files)
        except DlscaleError:
            if files is not None and name not in self.manager.ready_names():
                self.uploads.discard(name)
            raise
        if files is None:
            self.uploads.discard(name)  # loaded from the repository again

    async def unload_model(self, name: str) -> None:
        self._check_control()
        await self.manager.unload(name)
        self.uploads.discard(name)

    # -- trace and log settings -------------------------------------------------------------------

    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]:
        """Triton's trace extension: the settings (of a model) after applying `changes`."""
        if model:
            self.manager.get(model)  # an unknown or unready model is an error, as in Triton
        if changes:
            return self.tracer.update(changes, model)
        return self.tracer.settings(model)

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, str | bool | int]:
        """Triton's logging extension: the settings after applying `changes`."""
        return self.logs.update(changes) if changes else self.logs.settings()

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Triton's statistics extension: one entry per served version."""
        if name:
            served = [self.manager.get(name, version)]
        else:
            served = [v for e in self.manager.entries() for v in e.versions.values()]
        return [s.stats.snapshot() for s in served]

    def _check_control(self) -> None:
        check_model_control(self.model_control)


def check_model_control(model_control: str) -> None:
    """Loading and unloading over the API are refused under --model-control none."""
    if model_control == "none":
        raise Unsupported(
            "the server was started with --model-control none: models cannot be loaded or "
            "unloaded through the API (start it with --model-control explicit)"
        )


def _rows(served: ServedVersion, request: InferenceRequest) -> int:
    """Inferences a request holds (Triton's inference_count): its batch, 1 if it has none."""
    if not served.config.batched or not request.inputs:
        return 1
    return int(next(iter(request.inputs.values())).shape[0])


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


# -- shared memory ---------------------------------------------------------------------------------


def _names_regions(request: InferenceRequest) -> bool:
    return bool(request.in_regions) or any(o.region for o in request.outputs or ())


def _resolve(served: ServedVersion, request: InferenceRequest, lease: Lease) -> None:
    """Inputs in regions become arrays over them; outputs' places are checked before compute."""
    device = _device_of(served) if request.in_regions else None
    for name, placed in request.in_regions.items():
        if name in request.inputs:
            raise InvalidInput(f"input {name!r} is given twice: in the message and in a region")
        request.inputs[name] = lease.input(name, placed, device)
    for output in request.outputs or ():
        if output.region is not None:
            lease.check_output(output.name, output.region)


def _device_of(served: ServedVersion) -> str | None:
    """The device whose memory every instance of the model takes inputs in place from."""
    devices = {getattr(i.backend, "device_buffers", None) for i in served.instances}
    return devices.pop() if len(devices) == 1 else None


def _submit(
    served: ServedVersion, request: InferenceRequest, lease: Lease | None, times: RequestTimes
) -> asyncio.Future[Tensors]:
    """Queue the request; the batcher holds the lease until it no longer reads the inputs."""
    release = lease.hold() if lease is not None else None
    try:
        future = served.batcher.submit(
            request.inputs, request.priority, request.timeout_us, release, times
        )
    except BaseException:
        if release is not None:
            release()
        raise
    return future


def _place(
    request: InferenceRequest, outputs: dict[str, Any], lease: Lease
) -> dict[str, RegionTensor]:
    """Write the outputs asked into regions; what the answer says of each instead of data."""
    return {
        o.name: lease.write(o.name, outputs[o.name], o.region)
        for o in request.outputs or ()
        if o.region is not None
    }


def _host(array: Any) -> np.ndarray:
    # A batch computed from device inputs may answer with device arrays.
    return array if isinstance(array, np.ndarray) else cuda_memory.to_host(array)


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
