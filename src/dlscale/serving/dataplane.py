"""The DataPlane: health, metadata, config, inference and statistics of one host's models.

Protocol-agnostic: frontends only decode and encode. Model control (load, unload, the index,
uploads, trace and log settings) is the control plane's (serving/control/plane.py); a request's
shared-memory regions are its lease's (serving/regions/lease.py); what a request may ask is
serving/validation.py's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dlscale import __version__
from dlscale.errors import DlscaleError, InvalidInput, Unavailable
from dlscale.serving.batches import Tensors
from dlscale.serving.cache import CacheLookup, ResponseCache
from dlscale.serving.caller import CallPaths
from dlscale.serving.control.demand import OnDemand
from dlscale.serving.control.views import config_view
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.trace import Tracer
from dlscale.serving.regions.lease import RequestRegions, step_inputs, to_host
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.serving.served import ServedVersion
from dlscale.serving.streams import OnEnd, aclose, joined, open_stream
from dlscale.serving.validation import check, check_schedule_parameters
from dlscale.types import (
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RegionTensor,
    ServerMetadata,
    TensorSpec,
)
from dlscale.wire.classification import top_classes

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
    "generate",
)


class DataPlane:
    """Validates requests against model metadata, routes them to batchers, records outcomes."""

    def __init__(
        self,
        manager: ModelManager,
        shared_memory: SharedMemoryRegistry | None = None,
        tracer: Tracer | None = None,
        strict_readiness: bool = True,
        cache: ResponseCache | None = None,
    ) -> None:
        self.manager = manager
        self.strict_readiness = strict_readiness
        #: Answers of models whose config enables the response cache (None: no cache).
        self.cache = cache
        #: The shared-memory regions requests may name (off unless the server allows them).
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.tracer = tracer or Tracer()
        #: Loads the models requests name that are not loaded (--model-control on-demand).
        self.demand: OnDemand | None = None
        self._accepting = True
        self._started = False  # the models asked for at start have each been tried
        #: The models that said they cannot serve at the last readiness check (`ready`).
        self._said_not_ready: list[str] = []
        #: The models' metrics in Prometheus' text format; the host plane above the metrics
        #: room gives it (this room may not import the exposition that reads it).
        self.exposition: Callable[[], bytes] = bytes
        #: One step of a pipeline: served as a client's request, its outputs kept where made
        #: (made once: a bound method is made anew at each read, once per request).
        self._step = functools.partial(self._serve, on_device=True)

    # -- health and metadata --------------------------------------------------------------------

    def live(self) -> bool:
        """Live from the moment a frontend answers, while models load too."""
        return True

    async def ready(self) -> bool:
        """Ready once the start's models were tried, while accepting requests, and (strict, as
        Triton's --strict-readiness) while every model the server should serve is READY and
        each of its loaded versions says it can serve (`ServedVersion.answers_ready`)."""
        if not self._accepting or not self._started:
            return False
        if not self.strict_readiness:
            return True
        served = self.manager.served()
        answers = await asyncio.gather(*(s.answers_ready() for s in served))
        said = zip(served, answers, strict=True)
        self._said_not_ready = [s.version.name for s, yes in said if not yes]
        return not self.manager.not_ready() and not self._said_not_ready

    def not_ready_reason(self) -> str:
        """Why `ready` says no, in words a person acts on: which models, in which state, why."""
        if not self._accepting:
            return "shutting down"
        if not self._started:
            return "loading the models it starts with"
        waiting = self.manager.not_ready() if self.strict_readiness else []
        return "; ".join(
            [f"model {e.name!r} is {e.state.value}" + (f": {e.reason}" if e.reason else "")
             for e in waiting]
            + [f"model {name!r} says it cannot serve now (its is_ready, or its worker process)"
               for name in self._said_not_ready]
        )  # fmt: skip

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
        for served in self.manager.served():
            served.runner.cut(error)

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and the extensions it offers now."""
        extensions: tuple[str, ...] = EXTENSIONS
        if self.shared_memory.enabled:
            extensions += ("system_shared_memory",)
        if self.shared_memory.cuda_ready:
            extensions += ("cuda_shared_memory",)
        return ServerMetadata("dlscale", __version__, extensions)

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (version) serves requests now: loaded, and each of its instances
        says it can serve (`ServedVersion.answers_ready`)."""
        try:
            served = self.manager.get(name, version)
        except DlscaleError:
            return False
        return await served.answers_ready()

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """The model's versions, platform and tensors."""
        served = self.manager.get(name, version)
        entry = next(e for e in self.manager.entries() if e.name == name)
        return ModelMetadata(
            name=name,
            versions=tuple(str(v) for v in sorted(entry.versions)),
            platform=served.config.platform_name,
            inputs=tuple(served.inputs),
            outputs=tuple(served.outputs),
            kind=served.runner.kind,
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

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Triton's statistics extension: one entry per served version."""
        served = [self.manager.get(name, version)] if name else self.manager.served()
        return [s.stats.snapshot() for s in served]

    def metrics_text(self) -> bytes:
        """The models' metrics (Triton's, dlscale's and vLLM's names), as the metrics port
        writes them, for the REST port's /metrics (where vLLM's dashboard looks)."""
        return self.exposition()

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
        refusal = served.runner.refuse_early()
        if refusal is not None:
            served.stats.record_failure(refusal.reason, 0)
        return refusal

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Validate, queue, wait, and answer one request; every outcome is counted."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        # In use from here: neither evicted under the request nor while it waits for its load
        # (two calls: a context manager made eight a request).
        memory, name = self.manager.memory, request.model_name
        memory.enter(name)
        try:
            if self.demand is not None:  # not awaited otherwise: a coroutine less per request
                await self._resident(request)
            return await self._serve(request)
        finally:
            memory.leave(name)

    async def _resident(self, request: InferenceRequest) -> None:
        """Load the request's model first when it is not loaded (the server loads on demand)."""
        if self.demand is not None:
            check_schedule_parameters(request.parameters)
            await self.demand.resident(request.model_name, request.timeout_us)

    async def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """The 0..N responses of a model that streams (serving/streams.py); closing the
        iterator early (the client left) frees the request's sequence at once."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        check_schedule_parameters(request.parameters)
        memory, name = self.manager.memory, request.model_name
        memory.enter(name)  # not evicted while it streams, as `infer`
        try:
            await self._resident(request)
            served = self.manager.get(name, request.model_version)
            responses = open_stream(served, request, self._stream_trace(served, request))
            try:
                async for response in responses:
                    yield response
            finally:
                await aclose(responses)
        finally:
            memory.leave(name)

    def call_paths(self) -> CallPaths:
        """This plane's paths for models that call models, for the composition root to connect
        to the manager's route (`manager.calls.connect(plane.call_paths())`)."""
        return CallPaths(self.infer, self._answers)

    async def _answers(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Every response of the model: its stream, or its one answer (what a model's
        `exec(decoupled=True)` iterates, whichever kind it calls)."""
        served = self.manager.get(request.model_name, request.model_version)
        if served.runner.kind.streams:
            async for response in self.stream(request):
                yield response
        else:
            yield await self.infer(request)

    async def _serve(self, request: InferenceRequest, on_device: bool = False) -> InferenceResponse:
        """`infer` past the shutdown check: a pipeline admitted before shutdown runs its steps.

        `on_device`: a pipeline's step, whose outputs go to the next step as computed (a step
        that answers in device memory hands it on); a client's answer is always on the host.
        The version's plan (serving/request_plan.py) holds what every request is checked and
        answered with; with tracing off, no trace is started or finished.
        """
        if request.parameters:  # most requests carry none
            check_schedule_parameters(request.parameters)
        times = RequestTimes(time.perf_counter_ns())
        served = self.manager.get(request.model_name, request.model_version)
        plan = served.plan
        if plan.streams:  # one answer only if generative
            return await joined(served, request, self._stream_trace(served, request))
        trace = None
        if not self.tracer.off:
            trace = self._trace(served, request, "pipeline step" if on_device else "model call")
        if on_device:
            devices = (i.backend.capabilities.device_buffers for i in served.instances)
            request.inputs = step_inputs(devices, request.inputs)
        regions = RequestRegions.of(self.shared_memory, request)
        try:
            if regions is not None:
                regions.bind(i.backend.capabilities.device_buffers for i in served.instances)
            wanted, rows = check(served, request)
            lookup = None  # the cache's answer, when the model caches and no region is named
            if self.cache is not None and served.config.response_cache and regions is None:
                lookup = CacheLookup.find(self.cache, served, request, wanted, self.manager.get)
            if lookup is not None and lookup.answer is not None:
                return self._from_cache(served, request, lookup, times, trace, rows)
            outputs = await self._submit(served, request, regions, times)
            placed: dict[str, RegionTensor] = regions.place(outputs) if regions else {}
            answer = _answers(served, outputs, wanted, placed, on_device)
            if lookup is not None:
                lookup.keep(answer)
        except BaseException as exc:  # failed, or its caller left (cancelled): its span still ends
            times.request_end = time.perf_counter_ns()
            if isinstance(exc, DlscaleError):
                served.stats.record_failure(exc.reason, times.request_end - times.request_start)
            if trace is not None:
                self.tracer.finish(trace, times, ok=False)
            raise
        finally:
            if regions is not None:
                regions.lease.release()
        times.request_end = time.perf_counter_ns()
        served.stats.record_success(times, rows)
        if trace is not None:
            self.tracer.finish(trace, times)
        # In field order, no keywords: a call with keywords builds a dict per request.
        return InferenceResponse(request.model_name, answer, plan.version, request.id, {}, placed)

    def _trace(
        self, served: ServedVersion, request: InferenceRequest, kind: str = "", nests: bool = True
    ) -> Any:
        """The request's trace when its scope samples it (None: not traced)."""
        version = served.version
        return self.tracer.start(
            version.name, version.version, request.id, request.traceparent, kind, nests
        )

    def _stream_trace(self, served: ServedVersion, request: InferenceRequest) -> OnEnd | None:
        """What ends a stream's trace when its request is traced (its span stays out of the
        context: a stream's iteration runs in its consumer's)."""
        trace = self._trace(served, request, nests=False)
        return None if trace is None else functools.partial(self.tracer.finish, trace)

    def _from_cache(
        self,
        served: ServedVersion,
        request: InferenceRequest,
        lookup: CacheLookup,
        times: RequestTimes,
        trace: Any,
        rows: int,
    ) -> InferenceResponse:
        """A request answered by the cache: a success that ran no batch."""
        assert lookup.answer is not None
        times.request_end = time.perf_counter_ns()
        total = times.request_end - times.request_start
        served.stats.record_cache_hit(total, lookup.ns, rows)
        if trace is not None:
            self.tracer.finish(trace, times)
        return InferenceResponse(
            model_name=request.model_name,
            model_version=served.plan.version,
            id=request.id,
            outputs=dict(lookup.answer),
        )

    def _submit(
        self,
        served: ServedVersion,
        request: InferenceRequest,
        regions: RequestRegions | None,
        times: RequestTimes,
    ) -> Awaitable[Tensors]:
        """Queue the request (a plain call: the caller awaits the answer, no coroutine between);
        the runner holds the regions while it reads the inputs."""
        release = regions.lease.hold() if regions is not None else None
        try:
            return served.runner.submit(request, times, release, self._step)
        except BaseException:
            if release is not None:
                release()
            raise


def _answers(
    served: ServedVersion,
    outputs: Tensors,
    wanted: Mapping[str, int],
    placed: Mapping[str, RegionTensor],
    on_device: bool,
) -> dict[str, np.ndarray]:
    """The outputs a request asked for and gets in its answer (not those placed in regions)."""
    answer = {}
    for name, classes in wanted.items():  # a loop, not calls per output: most are host arrays
        if name in placed:
            continue
        array = outputs[name]
        if not on_device and type(array) is not np.ndarray:
            array = to_host(array)
        if classes:  # its top classes, when the request asked for them
            labels = served.labels.get(name, ())
            array = top_classes(array, classes, labels, served.config.batched, name)
        answer[name] = array
    return answer
