"""What a frontend needs of the data plane: declared once, here, for every process that serves it.

`Plane` declares the Plane's methods once: their typed signatures, each marked with its room
(`@data`, `@control`); `PLANE_METHODS`, the list the workers' forwards are built from, is read
off the marks. The REST routes and the gRPC servicer call only these,
so the same frontends serve a host's `serving.host.HostPlane` (`dlscale serve`), the worker
processes' proxy (frontends/workers/remote.py, whose forwards and whose owner's whitelist are
built from this list); a fleet (`dlscale.scale`) is made of whole servers, each a HostPlane.
Adding a method: its marked signature in `Plane`, its implementation in each plane;
tests/unit/frontends/test_plane_contract.py checks that all of them agree.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

from dlscale.errors import DlscaleError
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.types import (
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class PlaneMethod:
    """One operation of the Plane: its name, whether callers await it, which room answers it,
    and whether it answers with a stream (an async iterator the caller closes when it leaves)."""

    name: str
    asynchronous: bool
    #: "data": serving/dataplane.py; "control": serving/control/plane.py.
    room: Literal["data", "control"]
    #: False: a REST worker answers it itself, without the round trip to the owner (which would
    #: cost more than the answer saves): its proxy writes that method by hand.
    forwarded: bool = True
    #: True: the method returns an async iterator of answers (not awaited: iterated, and closed
    #: with `aclose()` by a caller that leaves early); `asynchronous` is then False.
    stream: bool = False


F = TypeVar("F", bound=Callable[..., Any])


def _room(
    room: Literal["data", "control"], *, forwarded: bool = True, stream: bool = False
) -> Callable[[F], F]:
    """Mark a method of `Plane` as one of its operations: `PLANE_METHODS` is read off them."""

    def mark(method: F) -> F:
        setattr(method, _MARK, (room, forwarded, stream))
        return method

    return mark


_MARK = "__plane_method__"
data = functools.partial(_room, "data")
control = functools.partial(_room, "control")


#: The shared-memory registry's operations the extensions' routes make (all synchronous).
REGISTRY_METHODS: tuple[str, ...] = (
    "register_system",
    "register_cuda",
    "status",
    "unregister",
    "users",
    "cuda_ready",
)


class Plane(Protocol):
    """The protocol-agnostic operations behind every REST route and gRPC method; each is marked
    with its room (`data` or `control`), and `PLANE_METHODS` is read off the marks."""

    #: The shared-memory regions clients registered (the extensions' routes and RPCs use it).
    shared_memory: SharedMemoryRegistry

    @data()
    def live(self) -> bool: ...

    @data()
    async def ready(self) -> bool: ...

    @data()
    def not_ready_reason(self) -> str: ...

    @data()
    def server_metadata(self) -> ServerMetadata: ...

    @data()
    async def model_ready(self, name: str, version: str = "") -> bool: ...

    @data()
    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    @data()
    def model_config(self, name: str, version: str = "") -> ModelConfigView: ...

    @data()
    def single_input(self, name: str, version: str = "") -> tuple[TensorSpec, bool]: ...

    @data(forwarded=False)
    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None: ...

    @data()
    async def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    @data(stream=True)
    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """0..N responses to one request, the last with `final` set; errors (the request's, or
        one that ends the stream) are raised by the iteration. A caller that leaves early closes
        the iterator (`aclose()`), which frees the request's sequence at once."""
        ...

    @data()
    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]: ...

    @data()
    def metrics_text(self) -> bytes:
        """The models' Prometheus metrics in the text format (the REST port's /metrics)."""
        ...

    @control()
    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]: ...

    @control()
    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None: ...

    @control()
    async def unload_model(self, name: str) -> None: ...

    @control()
    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]: ...

    @control()
    def log_settings(
        self, changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | bool | int]: ...


#: The Plane's operations, in declaration order, as its methods' marks say.
PLANE_METHODS: tuple[PlaneMethod, ...] = tuple(
    PlaneMethod(name, inspect.iscoroutinefunction(member), *getattr(member, _MARK))
    for name, member in vars(Plane).items()
    if hasattr(member, _MARK)
)
#: The declaration by name.
METHODS: dict[str, PlaneMethod] = {m.name: m for m in PLANE_METHODS}


@runtime_checkable
class Remote(Protocol):
    """A plane whose answers come from another process: its calls are awaited, never waited on."""

    async def ask(self, method: str, *args: Any, **kwargs: Any) -> Any: ...


def _asked(
    method: Callable[Concatenate[Any, P], T],
) -> Callable[Concatenate[Asked, P], Coroutine[Any, Any, T]]:
    """The view's form of a synchronous Plane method: awaited, typed as the declaration."""
    name = method.__name__

    async def ask(view: Asked, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if view.owner is not None:  # a REST worker's proxy: asked of its owner, awaited
            return cast(T, await view.owner.ask(name, *args, **kwargs))
        return cast(T, getattr(view.plane, name)(*args, **kwargs))  # answers at once

    ask.__name__ = ask.__qualname__ = name
    return ask


class Asked:
    """The frontends' view of a Plane: every forwarded method awaited, so that no call from a
    frontend can block its event loop (a REST worker's proxy asks its owner over the
    asynchronous channel). The synchronous methods are read off the declaration, one line each;
    tests/unit/frontends/test_plane_contract.py checks that the view has every method of
    `PLANE_METHODS`, each awaited but `refuse_early` (answered in place) and `stream`."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        #: The plane whose answers come from another process (decided once, not per call).
        self.owner = plane if isinstance(plane, Remote) else None
        self.shared_memory = plane.shared_memory
        self.infer = plane.infer
        self.ready = plane.ready
        self.model_ready = plane.model_ready
        self.stream = plane.stream
        self.load_model = plane.load_model
        self.unload_model = plane.unload_model
        #: Answered in the caller's own process by every plane (`forwarded=False`).
        self.refuse_early = plane.refuse_early

    @property
    def remote(self) -> bool:
        """Whether the answers come from another process."""
        return self.owner is not None

    live = _asked(Plane.live)
    not_ready_reason = _asked(Plane.not_ready_reason)
    server_metadata = _asked(Plane.server_metadata)
    model_metadata = _asked(Plane.model_metadata)
    model_config = _asked(Plane.model_config)
    single_input = _asked(Plane.single_input)
    statistics = _asked(Plane.statistics)
    repository_index = _asked(Plane.repository_index)
    trace_settings = _asked(Plane.trace_settings)
    log_settings = _asked(Plane.log_settings)
    metrics_text = _asked(Plane.metrics_text)
