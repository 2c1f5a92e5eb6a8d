"""The ingress's data plane: the frontends' Plane over model deployments reached by handles.

Metadata, config and the raw-input form are answered from what a replica described when the
model was deployed; inference goes to the model's deployment through a Ray Serve handle, whose
replicas validate, batch and compute it with the serving core. Model states follow Ray
Serve's own (`refresh`), so several ingress replicas, and deployments changed from outside (a
second `dlscale serve --ray --replicas N`), stay consistent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from dlscale import __version__
from dlscale.errors import (
    DlscaleError,
    InvalidInput,
    NotFound,
    Unavailable,
    Unsupported,
    known_names,
)
from dlscale.models.repository import ModelRepository
from dlscale.scale import deploy
from dlscale.scale.calls import remote_call, remote_stream
from dlscale.scale.replica import ModelView, VersionView
from dlscale.scale.settings import ScaleSettings
from dlscale.serving.control.plane import check_model_control
from dlscale.serving.dataplane import EXTENSIONS
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.serving.served import ModelState
from dlscale.serving.versions import resolve_version
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

log = logging.getLogger("dlscale.scale")


@dataclass
class ModelRoute:
    """What the ingress knows of one model: its state, its description, its request counts."""

    state: ModelState
    reason: str = ""
    view: ModelView | None = None
    #: Ray Serve updated the deployment since it was described: describe it again once it runs.
    stale: bool = False
    stats: dict[int, ModelStats] = field(default_factory=dict)

    def describe(self, view: ModelView) -> None:
        """Serve the versions a replica described; counts of versions still served carry on."""
        self.view, self.stale = view, False
        self.state, self.reason = ModelState.READY, ""
        self.stats = {v: self.stats.get(v) or ModelStats(view.name, str(v)) for v in view.versions}


class Router:
    """Implements the frontends' Plane for the Ray Serve ingress."""

    def __init__(
        self,
        settings: ScaleSettings,
        failed: dict[str, str] | None = None,
        pending: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.repository = ModelRepository(settings.repository.resolve())
        #: `failed`: models the command line could not deploy, and why.
        self._routes = {
            name: ModelRoute(ModelState.UNAVAILABLE, reason)
            for name, reason in (failed or {}).items()
        }
        #: `pending`: models the command line deploys after this ingress (LOADING until their
        #: applications appear: the server is live at once, ready once they run).
        self._routes.update({name: ModelRoute(ModelState.LOADING) for name in pending})
        self._pending = set(pending)
        self._handles: dict[str, DeploymentHandle[Any]] = {}
        self._loading: set[str] = set()  # models this ingress is deploying now
        # Off: a client's region is in its own host's memory, which no replica can read.
        self.shared_memory = SharedMemoryRegistry(enabled=False)
        self._accepting = True

    # -- following Ray Serve ---------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the model applications' states from Ray Serve; describe models newly running."""
        states = await asyncio.to_thread(deploy.model_states)
        for name in self.apply(states):
            try:
                view = await self._call(name, "describe")
            except DlscaleError as exc:
                log.warning("model %s: running, but no replica described it yet: %s", name, exc)
                continue
            self._routes[name].describe(view)

    def apply(self, states: dict[str, deploy.AppState]) -> list[str]:
        """Take Ray Serve's application states; returns the models to describe now."""
        to_describe = []
        for name in sorted(set(states) | set(self._routes)):
            route = self._routes.setdefault(name, ModelRoute(ModelState.LOADING))
            state = states.get(name)
            if state is not None:
                self._pending.discard(name)  # its application exists: Ray's state says the rest
            if state is None:
                # A model being deployed has no application yet: it is not gone.
                if name not in self._loading and name not in self._pending:
                    self._forget(name, route.reason or "not deployed")
            elif state.status == "RUNNING":
                if route.view is None or route.stale:
                    to_describe.append(name)
            elif state.status in ("DEPLOYING", "UNHEALTHY"):
                # Replicas starting or restarting: those still running keep serving.
                route.stale = route.view is not None
                if route.view is None:
                    route.state = ModelState.LOADING
            elif state.status == "DELETING":
                route.state, route.reason = ModelState.UNLOADING, "deleting"
            else:  # DEPLOY_FAILED, NOT_STARTED
                self._forget(name, _last_line(state.message) or state.status.lower())
        return to_describe

    def _forget(self, name: str, reason: str) -> None:
        self._routes[name] = ModelRoute(ModelState.UNAVAILABLE, reason)
        self._handles.pop(name, None)

    def stop_accepting(self) -> None:
        """Shutdown has begun: new requests are refused."""
        self._accepting = False

    # -- health and metadata ---------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready while accepting and no model is still being deployed."""
        return self._accepting and all(
            r.state is not ModelState.LOADING for r in self._routes.values()
        )

    def not_ready_reason(self) -> str:
        """Why `ready` says no: shutting down, or the models still being deployed."""
        if not self._accepting:
            return "shutting down"
        loading = sorted(n for n, r in self._routes.items() if r.state is ModelState.LOADING)
        return f"deploying models {', '.join(loading)}" if loading else ""

    def server_metadata(self) -> ServerMetadata:
        # Traces and logs are each host's own: not offered behind the ingress.
        extensions = tuple(e for e in EXTENSIONS if e not in ("trace", "logging"))
        return ServerMetadata("dlscale", __version__, extensions)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self._version(name, version)
        except DlscaleError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self._version(name, version)[1].metadata

    def model_config(self, name: str, version: str = "") -> ModelConfigView:
        return self._version(name, version)[1].config

    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None:
        """None: each model deployment's own DataPlane applies its admission limits."""
        return None

    def single_input(self, name: str, version: str = "") -> tuple[TensorSpec, bool]:
        view = self._version(name, version)[1]
        if view.single_input is None:
            raise InvalidInput(view.single_input_refusal)
        return view.single_input

    def _version(self, name: str, version: str) -> tuple[ModelRoute, VersionView, int]:
        """The route and served version a request goes to (the newest when `version` is empty)."""
        route = self._routes.get(name)
        if route is None:
            ready = [n for n, r in self._routes.items() if r.state is ModelState.READY]
            raise NotFound(f"unknown model {name!r}" + known_names(name, ready, "loaded"))
        if route.state is not ModelState.READY or route.view is None:
            detail = f": {route.reason}" if route.reason else ""
            raise Unavailable(f"model {name!r} is not ready ({route.state.value}{detail})")
        number = resolve_version(name, version, route.view.versions)
        return route, route.view.versions[number], number

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Forward one request to a replica of its model; every outcome is counted here too."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        route, version, number = self._version(request.model_name, request.model_version)
        stats = route.stats[number]
        start = time.perf_counter_ns()
        try:
            response: InferenceResponse = await self._call(request.model_name, "infer", request)
        except DlscaleError as exc:
            stats.record_failure(exc.reason, time.perf_counter_ns() - start)
            raise
        end = time.perf_counter_ns()
        # The ingress sees a request's whole time; its queue and compute happen in a replica, so
        # they count here as none (each replica's own statistics hold them).
        times = RequestTimes(start, end, end, end, end, end, end)
        batched = version.config.max_batch_size > 0 and request.inputs
        rows = int(next(iter(request.inputs.values())).shape[0]) if batched else 1
        stats.record_success(times, rows)
        return response

    async def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """A model that streams: its responses from a replica as they come (calls.py's
        `remote_stream`); closing this early cancels the replica's stream."""
        if not self._accepting:
            raise Unavailable("the server is shutting down")
        route, _, number = self._version(request.model_name, request.model_version)
        stats = route.stats[number]
        start = time.perf_counter_ns()
        handle = self._handle(request.model_name)
        outcome = "CANCELED"  # unless the stream ends or fails: its client left
        try:
            async for response in remote_stream(handle, request.model_name, "stream", (request,)):
                yield response
            outcome = ""
        except DlscaleError as exc:
            outcome = exc.reason
            raise
        finally:
            end = time.perf_counter_ns()
            if outcome:
                stats.record_failure(outcome, end - start)
            else:
                stats.record_success(RequestTimes(start, end, end, end, end, end, end), 1)

    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]:
        raise Unsupported("trace settings are per host: not served behind Ray Serve's ingress")

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, str | bool | int]:
        raise Unsupported("log settings are per host: not served behind Ray Serve's ingress")

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        handle = self._handle(name)
        return await remote_call(handle, name, method, args, self.settings.request_timeout_s)

    def _handle(self, name: str) -> DeploymentHandle[Any]:
        handle = self._handles.get(name)
        if handle is None:
            handle = serve.get_deployment_handle(name, deploy.model_app(name))
            self._handles[name] = handle
        return handle

    # -- repository and statistics ---------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every model of the repository with its state, one row per served version."""
        index: list[RepositoryEntry] = []
        for name in self.repository.names():
            route = self._routes.get(name, ModelRoute(ModelState.UNAVAILABLE, "not deployed"))
            if ready_only and route.state is not ModelState.READY:
                continue
            versions = sorted(route.view.versions) if route.view else []
            state = route.state.value
            rows = [RepositoryEntry(name, state, route.reason, str(v)) for v in versions]
            index.extend(rows or [RepositoryEntry(name, state, route.reason)])
        return index

    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None:
        """Deploy (or update) a model's application; returns once a replica described it."""
        check_model_control(self.settings.model_control)
        if parameters:
            raise Unsupported(
                "loading with a config or files is not offered behind Ray Serve's ingress: "
                "change the repository and load the model again"
            )
        if name not in self.repository.names():
            raise NotFound(f"no model {name!r} in the repository {self.repository.root}")
        route = self._routes.setdefault(name, ModelRoute(ModelState.LOADING))
        if route.view is None:
            route.state = ModelState.LOADING
        self._loading.add(name)
        try:
            await asyncio.to_thread(deploy.deploy_model, self.settings, name)
            self._routes[name].describe(await self._call(name, "describe"))
        except DlscaleError as exc:
            if self._routes[name].view is None:
                self._forget(name, str(exc))
            raise
        finally:
            self._loading.discard(name)

    async def unload_model(self, name: str) -> None:
        """Delete a model's application; its replicas finish their requests first."""
        check_model_control(self.settings.model_control)
        if name not in self._routes:
            raise NotFound(f"unknown model {name!r}")
        self._routes[name].state = ModelState.UNLOADING
        await asyncio.to_thread(deploy.delete_model, name)
        self._forget(name, "unloaded")

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Requests as this ingress saw them, per model version (batches: see the replicas)."""
        if name:
            route, _, number = self._version(name, version)
            return [route.stats[number].snapshot()]
        ready = [r for _, r in sorted(self._routes.items()) if r.state is ModelState.READY]
        return [s.snapshot() for r in ready for _, s in sorted(r.stats.items())]

    def metrics_text(self) -> bytes:
        """None here: each replica's ports serve its models' metrics (Ray scrapes them)."""
        return b""


def _last_line(message: str, limit: int = 500) -> str:
    """The last line of Ray Serve's message (a traceback ends with the error itself)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""
