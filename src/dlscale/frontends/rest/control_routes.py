"""The Open Inference Protocol's REST routes other than inference: health, metadata and config,
shared-memory regions, the repository, statistics, trace and log settings.

Each is one Plane call and its answer rendered (`render`); `api.py` routes to them, checks the
caller's API group and method first, and maps their errors to statuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlscale.errors import DlscaleError, InvalidInput
from dlscale.frontends.offload import OFF_LOOP_BYTES, off_loop
from dlscale.frontends.plane import Asked
from dlscale.frontends.rest import render, shared_memory
from dlscale.frontends.rest.documents import json_object, load_request
from dlscale.frontends.rest.responses import RestResponse, error_response, json_response
from dlscale.serving.metrics.exposition import CONTENT_TYPE as METRICS_TYPE
from dlscale.wire.tensors import Buffer

#: The answer with no body: 200 and nothing else.
EMPTY_OK = RestResponse(200, [])


class ControlRoutes:
    """The handlers, each taking the route's path arguments, the headers and the body."""

    def __init__(self, plane: Asked) -> None:
        self.plane = plane

    # -- health and metadata -----------------------------------------------------------------------

    async def live(self, args: list[str], headers: Mapping[str, str], body: Buffer) -> RestResponse:
        return (
            EMPTY_OK if await self.plane.live() else error_response(503, "the server is not live")
        )

    async def metrics(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return RestResponse(200, [await self.plane.metrics_text()], METRICS_TYPE)

    async def ready(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        if await self.plane.ready():
            return EMPTY_OK
        why = await self.plane.not_ready_reason()
        return error_response(503, f"the server is not ready: {why or 'it is starting'}")

    async def server_metadata(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.server_metadata(await self.plane.server_metadata()))

    async def model_metadata(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.model_metadata(await self.plane.model_metadata(*args)))

    async def model_ready(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        if await self.plane.model_ready(*args):
            return EMPTY_OK
        # Not ready is an answer, not a failed request (pollers ask often: nothing is logged).
        # The metadata call raises the error that says why (unknown, loading, ...).
        try:
            await self.plane.model_metadata(*args)
        except DlscaleError as exc:
            return error_response(exc.http_status, str(exc))
        return error_response(
            503,
            f"model {args[0]!r} is loaded but says it cannot serve now (its is_ready, or its "
            "worker process)",
        )

    async def config(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.model_config(await self.plane.model_config(*args)))

    # -- shared memory (the routes of frontends/rest/shared_memory.py) -----------------------------

    async def shm(self, args: list[str], headers: Mapping[str, str], body: Buffer) -> RestResponse:
        kind, name, action = args
        # A worker's registry is the owner's, behind a blocking channel: off the event loop.
        remote = self.plane.remote
        registry = self.plane.shared_memory
        doc = await off_loop(remote, shared_memory.handle, registry, kind, name, action, body)
        return EMPTY_OK if doc is None else json_response(doc)

    # -- repository and statistics -----------------------------------------------------------------

    async def index(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        doc = json_object(body, "repository index")
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(
                f"field 'ready' of the index request must be true or false, got {ready!r}"
            )
        return json_response(render.repository_index(await self.plane.repository_index(ready)))

    async def load(self, args: list[str], headers: Mapping[str, str], body: Buffer) -> RestResponse:
        large = len(body) > OFF_LOOP_BYTES  # a load with files: JSON and base64 decoded in a thread
        await self.plane.load_model(args[0], await off_loop(large, load_request, body))
        return EMPTY_OK

    async def unload(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        json_object(body, "unload")  # parameters (unload_dependents) have no meaning here
        await self.plane.unload_model(args[0])
        return EMPTY_OK

    async def stats(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.statistics(await self.plane.statistics(*args)))

    # -- trace and log settings -----------------------------------------------------------------

    async def trace(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        changes = json_object(body, "trace setting")
        return json_response(await self.plane.trace_settings(args[0], changes))

    async def logging(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        changes = json_object(body, "log setting")
        return json_response(await self.plane.log_settings(changes))
