"""The Backend protocol: one loaded copy of a model on one device, computing batches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dlscale.errors import DlscaleError
from dlscale.types import InferenceRequest, InferenceResponse, Parameter, Parameters, TensorSpec


class ModelCaller(Protocol):
    """Calls another model of the same server, blocking: what a backend whose model calls
    models (`Capabilities.calls_models`) is given. Called from an instance thread, never from
    the event loop; the serving core implements it (serving/manager.py)."""

    def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        """The responses of a model that streams, as they come (Triton's decoupled BLS)."""
        ...


#: How a backend says that it can no longer serve (its engine's thread died): the reason, in
#: words a person acts on. Callable from any thread; the serving core makes the model not ready
#: with that reason and fails the requests it holds at once (serving/manager.py).
FailureReport = Callable[[str], None]


def model_folder(folder: Path) -> Path:
    """The model's folder (REPO/<name>) for the folder that holds its files: a numbered version
    folder's parent (REPO/<name>/<version>), else the folder itself (MLServer's layout)."""
    return folder.parent if folder.name.isdigit() else folder


@dataclass(frozen=True)
class BackendOptions:
    """How to load a model: where, with how many threads, at what optimization level."""

    device: str = "cpu"
    #: Threads inside one operator; 0 lets the runtime choose.
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    #: The config's max_batch_size (0: inputs have no batch dim); sizes batch buckets.
    max_batch_size: int = 0
    #: ONNX Runtime graph optimization: disable, basic, extended or all.
    graph_optimization_level: str = "all"
    #: Runtime-specific settings from the model config's [backend_options] table.
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The tensors config.toml declares (batch dim included as -1), empty when it declares
    #: none; a runtime without a model file to read them from (the null backend) serves these.
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    #: How the model calls other models of the server (set by the model manager; None outside
    #: a server); read by backends that declare `Capabilities.calls_models`.
    caller: ModelCaller | None = None
    #: Called by a backend that can no longer serve (set by the model manager; None outside a
    #: server): a backend whose engine runs in threads of its own calls it when they die, rather
    #: than leave its model READY with every request waiting for its timeout.
    report_failure: FailureReport | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a loaded backend can do, declared by the backend so that callers never probe it."""

    #: Batches it takes at once: an Instance runs that many calls in parallel threads.
    concurrency: int = 1
    #: The device whose memory it takes inputs from in place ("cuda:N"), None: host arrays only.
    device_buffers: str | None = None
    #: Whether it answers one request with a stream of responses (generative models).
    streams_answers: bool = False
    #: Whether its model calls other models of the server (pipelines, user code).
    calls_models: bool = False
    #: Whether it takes a batch as its requests' inputs, one mapping per client request, and
    #: answers each apart (`RequestsBackend`): Triton's Python models see the requests of a
    #: batch, not one merged tensor, and may fail one request alone.
    takes_requests: bool = False
    #: Whether it is a generative engine (`StreamingBackend` whose tensors follow
    #: backends/generative/contract.py): a plain infer call gets its stream joined into one
    #: answer, and the server keeps its token metrics.
    generates_text: bool = False
    #: Batches of at most this many rows (their inputs' first dimension) it computes on the
    #: event loop, not in its instance thread (0: never). For steps whose compute takes
    #: microseconds (top-k over a few classes): the hand-over to a thread and back (waking the
    #: thread, taking the GIL, waking the loop) costs them several times their compute in a busy
    #: server. The backend bounds it so that no batch it takes inline holds the loop for more
    #: than ~0.1 ms; such an `infer` must not block on I/O.
    inline_rows: int = 0
    #: Whether an Instance may also run its small batches on the event loop once it has
    #: measured them cheap (serving/instance.py, `InlineRows`: under ~0.1 ms each, learnt and
    #: unlearnt as they run). For a backend whose `infer` computes on the calling thread, keeps
    #: no state tied to a thread and does not wait on another process (ONNX Runtime's session).
    inline_measured: bool = False
    #: Whether `unload` may be called from another thread while a batch runs, and then stops
    #: that batch (the python backend kills its worker process): an Instance does so once the
    #: unload's grace is over, so that a hung model can be unloaded. Other backends' batches
    #: are waited for.
    stops_batches: bool = False
    #: Whether it is a generative engine whose steps the server can pace
    #: (backends/generative/contract.py, `PacedBackend`): with [qos] on its device, each engine
    #: step then takes a slot of the device's scheduler, as a classic model's batch does.
    paces_steps: bool = False
    #: Whether it is a generative engine whose steps run outside the server but which pauses
    #: between two steps when asked (backends/generative/contract.py, `PausableBackend`: vLLM's
    #: engine core): with [qos] on its device, it steps only while it holds a lease of the
    #: device's slot (serving/qos/leases.py).
    pauses_steps: bool = False
    #: Whether it says at run time if it can serve (`ReadyBackend`): a Python model's worker
    #: process alive, its own `is_ready`. Triton's instance readiness: the model is ready while
    #: every instance says so.
    reports_readiness: bool = False


@runtime_checkable
class Backend(Protocol):
    """A runtime holding one model on one device.

    `load` does the slow work (read the file, compile, capture) and must leave the backend able
    to run `infer` at once; `infer` takes and returns numpy arrays keyed by tensor name, batch
    first, and releases the GIL while it computes, so that an Instance can call it from a worker
    thread without stalling the event loop. `capabilities`, read after `load`, declares what
    else it can do (`Capabilities`): how many batches it takes at once (the torch backend on a
    GPU uploads one batch while it computes another), whether it reads device buffers in place.
    """

    path: Path
    options: BackendOptions

    def load(self) -> None: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def unload(self) -> None: ...


#: One request's answer from `RequestsBackend.infer_requests`: its outputs, or its own error.
RequestResult = dict[str, np.ndarray] | DlscaleError


@runtime_checkable
class RequestsBackend(Backend, Protocol):
    """A Backend that also takes a batch request by request (`Capabilities.takes_requests`)."""

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """One result per request, in order: its outputs (its own rows) or the error for it."""
        ...


@dataclass
class StreamPart:
    """One response of a streamed answer: its outputs (one request's, no batch dim merged with
    others), its response parameters, and whether it is the request's last."""

    outputs: dict[str, np.ndarray]
    parameters: Parameters = field(default_factory=dict)
    final: bool = False


@runtime_checkable
class StreamingBackend(Backend, Protocol):
    """A Backend that answers one request with 0..N responses (`Capabilities.streams_answers`).

    Generative engines (they batch at the iteration level themselves: the batcher does not
    re-batch them) and Python models that send several responses. `stream` is called on the
    server's event loop, once per request; the backend runs its engine in threads or processes
    of its own and must not block the loop. The last part it yields has `final` set (it may
    carry no outputs). Closing the iterator early (`aclose()`: the client disconnected or
    cancelled, or its deadline passed) must free the request's sequence in the engine at once.
    """

    def stream(
        self, request_id: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]
    ) -> AsyncIterator[StreamPart]: ...


@runtime_checkable
class ReadyBackend(Backend, Protocol):
    """A Backend that says at run time whether it can serve (`Capabilities.reports_readiness`).

    `ready` is awaited on the server's event loop for each readiness check (the model's and,
    under strict readiness, the server's); it bounds its own wait and must not block the loop.
    """

    async def ready(self) -> bool: ...
