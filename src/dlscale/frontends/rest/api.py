"""The Open Inference Protocol REST routes: one request in, one DataPlane call, one response out.

This module knows paths, methods and bodies but no socket: the HTTP transport (`transport.py`)
feeds it parsed requests, and any other server (an ASGI one, a test) can do the same. Tensors
are decoded and encoded by the wire codec (`dlscale.wire.rest`), answers rendered by `render`.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import unquote

from dlscale.errors import (
    DlscaleError,
    InvalidInput,
    PayloadTooLarge,
    UnsupportedMediaType,
    redact_paths,
)
from dlscale.frontends.access import Access, rest_group
from dlscale.frontends.limits import Limits
from dlscale.frontends.offload import off_loop
from dlscale.frontends.plane import Asked, Plane
from dlscale.frontends.rest import render, shared_memory
from dlscale.frontends.rest.documents import HEADER_LENGTH as HEADER_LENGTH
from dlscale.frontends.rest.documents import (
    header_length,
    json_object,
    length_header,
    load_request,
)
from dlscale.frontends.rest.generate import GenerateApi
from dlscale.frontends.rest.openai.routes import OpenAIApi
from dlscale.frontends.rest.responses import RestResponse as RestResponse
from dlscale.frontends.rest.responses import error_response as error_response
from dlscale.frontends.rest.responses import json_response as json_response
from dlscale.frontends.rest.tfserving import TfServingApi
from dlscale.serving.metrics.exposition import CONTENT_TYPE as METRICS_TYPE
from dlscale.serving.observe.logs import access, log_failure
from dlscale.serving.observe.otel import TRACEPARENT
from dlscale.wire.rest import (
    decode_raw_request,
    decode_request,
    encode_response,
)
from dlscale.wire.tensors import Buffer

log = logging.getLogger("dlscale.http")

JSON = "application/json"
OCTET = "application/octet-stream"


_EMPTY_OK = RestResponse(200, [])
#: Paths whose route is remembered: clients repeat a few; a flood of distinct ones only
#: refills the cache, which holds routes that exist and never more than this many.
_ROUTE_CACHE_SIZE = 1024
_Handler = Callable[[list[str], Mapping[str, str], Buffer], Awaitable[RestResponse]]
#: A route: its handler (None: no route), path arguments, the one method, and its API group.
_Route = tuple[_Handler | None, list[str], str, str]
#: Bodies larger than this are decoded off the event loop, so that the loop keeps answering.
OFF_LOOP_BYTES = 256 * 2**10


class RestApi:
    """Routes REST requests to the DataPlane and maps every DlscaleError to its status."""

    def __init__(
        self, dataplane: Plane, limits: Limits | None = None, access: Access | None = None
    ) -> None:
        self.dataplane = Asked(dataplane)
        self.limits = limits or Limits()
        self.max_body_bytes = self.limits.max_body_bytes
        self.access = access or Access()
        #: Whether any API group needs a key or a header (fixed at start): none, no check.
        self._guarded = bool(self.access)
        self.shared_memory = shared_memory.SharedMemoryApi(dataplane.shared_memory)
        self.generate = GenerateApi(dataplane, self.limits)
        self._routes: dict[str, _Route] = {}
        self.openai = OpenAIApi(dataplane, self.access, self._decoded)
        self.tfserving = TfServingApi(
            dataplane, self.limits, self.access, self.openai.handle, self._decoded
        )
        #: The handlers whose model may refuse a request before its body is read.
        self._inference = (self._infer, self.generate.generate, self.generate.generate_stream)

    async def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """Answer one request; `headers` has lower-case names."""
        # The route cache holds OIP routes only: a path found there is no OpenAI one, and with
        # the access log off the request goes straight to its handler (one coroutine less).
        route = self._routes.get(path)
        if route is not None and not access.isEnabledFor(logging.INFO):
            try:
                return await self._call(route, method, path, headers, body)
            except Exception as exc:
                return self._failed(method, path, route[1], exc)
        start = time.perf_counter()
        response = await self._answer(method, path, headers, body)
        if access.isEnabledFor(logging.INFO):
            size = sum(len(p) for p in response.parts)
            elapsed_ms = (time.perf_counter() - start) * 1000
            access.info("HTTP %s %s %d %d %.3fms", method, path, response.status, size, elapsed_ms)
        return response

    async def _answer(
        self, method: str, path: str, headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        if self.openai.serves(path):  # the OpenAI API's (and TensorFlow Serving's, under /v1/)
            tfserving = self.tfserving.route(path) if path.startswith("/v1/") else None
            if tfserving is None:  # in its own errors' shape (docs/openai.md)
                return await self.openai.handle(method, path, headers, body)
            return await self.tfserving.handle(tfserving, method, path, headers, body)
        args: list[str] = []
        try:
            route = self._route(path)
            args = route[1]
            if route[0] is None:
                return error_response(404, f"no route for {_short(path)!r}")
            return await self._call(route, method, path, headers, body)
        except Exception as exc:
            return self._failed(method, path, args, exc)

    def _call(
        self, route: _Route, method: str, path: str, headers: Mapping[str, str], body: Buffer
    ) -> Awaitable[RestResponse]:
        """The route's handler called (its coroutine, for the caller to await), once the
        caller may use its API group and its method is the route's."""
        handler, args, allowed, group = route
        assert handler is not None, "only a found route is called"
        if self._guarded:
            self.access.check(group, headers)
        if method != allowed and method not in allowed.split(", "):
            return _ready(
                error_response(
                    405,
                    f"{method} is not allowed on {_short(path)!r}; use {allowed}",
                    (("allow", allowed),),
                )
            )
        if "content-encoding" in headers:  # most requests have none: no call
            body = self._decoded(headers, body)
        return handler(args, headers, body)

    @staticmethod
    def _failed(method: str, path: str, args: list[str], exc: Exception) -> RestResponse:
        """The answer to a request that raised: its error's status, or 500 for a bug."""
        if isinstance(exc, DlscaleError):
            model = args[0] if args else ""
            log_failure("HTTP", model, exc.http_status, exc.reason, f"{method} {path}: {exc}")
            return error_response(exc.http_status, exc.message)
        # a bug must answer 500, not drop the connection
        log.exception("%s %s failed", method, path, exc_info=exc)
        return error_response(500, redact_paths(f"internal error: {exc!r}"))

    def refusal_before_body(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> RestResponse | None:
        """The answer to a request refused before its body is read, or None.

        Asked once the head is read: a caller without the API key or a restricted group's
        header (401 / 403), and an inference request whose model refuses it now (429), cost no
        body read, decode or task. Anything else about the request is left to `handle`.
        """
        route = self._routes.get(path)  # OIP routes only (see `handle`)
        if route is None and self.openai.serves(path):
            tfserving = self.tfserving.route(path) if path.startswith("/v1/") else None
            if tfserving is None:
                return self.openai.refusal_before_body(method, path, headers)
            refusal = self.tfserving.refusal_before_body(tfserving, method, headers)
            if refusal is None:
                return None
            log_failure(
                "HTTP", "", refusal.http_status, refusal.reason, f"{method} {path}: {refusal}"
            )
            challenge = (("www-authenticate", "Bearer"),) if refusal.http_status == 401 else ()
            return error_response(refusal.http_status, refusal.message, challenge)
        handler, args, _, group = route or self._route(path)
        if handler is None:
            return None  # `handle` answers 404
        if self._guarded:
            try:
                self.access.check(group, headers)
            except DlscaleError as exc:
                log_failure("HTTP", "", exc.http_status, exc.reason, f"{method} {path}: {exc}")
                challenge = (("www-authenticate", "Bearer"),) if exc.http_status == 401 else ()
                return error_response(exc.http_status, exc.message, challenge)
        if method != "POST" or handler not in self._inference:
            return None
        refusal = self.dataplane.refuse_early(args[0], args[1])
        if refusal is None:
            return None
        log_failure(
            "HTTP", args[0], refusal.http_status, refusal.reason, f"{method} {path}: {refusal}"
        )
        return error_response(refusal.http_status, refusal.message)

    # -- routing -----------------------------------------------------------------------------------

    @property
    def cached_routes(self) -> int:
        """How many paths the route cache holds now (never more than its bound)."""
        return len(self._routes)

    def _route(self, path: str) -> _Route:
        """The handler for a path, its path arguments, the one method it takes, its API group."""
        # Clients repeat the same few paths: resolving each once saves a parse per request.
        found = self._routes.get(path)
        if found is None:
            handler, args, allowed = self._resolve(path)
            # /metrics shows what the statistics extension shows: it is guarded as that.
            group = "statistics" if handler == self._metrics else rest_group(_parts(path)[1:])
            found = (handler, args, allowed, group)
            if handler is not None:
                if len(self._routes) >= _ROUTE_CACHE_SIZE:
                    self._routes.clear()
                self._routes[path] = found
        return found

    def _resolve(self, path: str) -> tuple[_Handler | None, list[str], str]:
        parts = _parts(path)
        if parts == ["metrics"]:  # vLLM's API port serves its metrics here
            return self._metrics, [], "GET"
        if not parts or parts[0] != "v2":
            return None, [], ""
        rest = parts[1:]
        match rest:
            case []:
                return self._server_metadata, [], "GET"
            case ["health", "live"]:
                return self._live, [], "GET"
            case ["health", "ready"]:
                return self._ready, [], "GET"
            case ["logging"]:
                return self._logging, [], "GET, POST"
            case ["trace", "setting"]:
                return self._trace, [""], "GET, POST"
            case ["models", "stats"]:
                return self._stats, ["", ""], "GET"
            case ["repository", "index"]:
                return self._index, [], "POST"
            case ["repository", "models", model, "load"]:
                return self._load, [model], "POST"
            case ["repository", "models", model, "unload"]:
                return self._unload, [model], "POST"
            case [prefix, *tail] if prefix in shared_memory.PREFIXES:
                found = shared_memory.route(prefix, tail)
                return (self._shm, *found) if found else (None, [], "")
            case ["models", model, *tail]:
                version = ""
                if tail[:1] == ["versions"] and len(tail) >= 2:
                    version, tail = tail[1], tail[2:]
                return self._model_route(model, version, tail)
        return None, [], ""

    def _model_route(
        self, model: str, version: str, tail: list[str]
    ) -> tuple[_Handler | None, list[str], str]:
        args = [model, version]
        match tail:
            case []:
                return self._model_metadata, args, "GET"
            case ["ready"]:
                return self._model_ready, args, "GET"
            case ["infer"]:
                return self._infer, args, "POST"
            case ["generate"]:
                return self.generate.generate, args, "POST"
            case ["generate_stream"]:
                return self.generate.generate_stream, args, "POST"
            case ["stats"]:
                return self._stats, args, "GET"
            case ["config"]:
                return self._config, args, "GET"
            case ["trace", "setting"] if not version:
                return self._trace, [model], "GET, POST"
        return None, [], ""

    def _decoded(self, headers: Mapping[str, str], body: Buffer) -> Buffer:
        """The body with any Content-Encoding undone, held to max_body_bytes once inflated."""
        encoding = headers.get("content-encoding")
        if encoding is None:  # most requests
            return body
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding not in ("gzip", "deflate"):
            raise UnsupportedMediaType(
                f"Content-Encoding {encoding!r}: expected gzip, deflate or none"
            )
        inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        try:
            out = inflater.decompress(body, self.max_body_bytes + 1)
        except zlib.error as exc:
            raise InvalidInput(f"the {encoding} body cannot be decompressed: {exc}") from None
        if len(out) > self.max_body_bytes:
            raise PayloadTooLarge(
                f"the decompressed body exceeds the limit of {self.max_body_bytes} bytes"
            )
        return out

    # -- health and metadata -----------------------------------------------------------------------

    async def _live(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return (
            _EMPTY_OK
            if await self.dataplane.live()
            else error_response(503, "the server is not live")
        )

    async def _metrics(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return RestResponse(200, [await self.dataplane.metrics_text()], METRICS_TYPE)

    async def _ready(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        if await self.dataplane.ready():
            return _EMPTY_OK
        why = await self.dataplane.not_ready_reason()
        return error_response(503, f"the server is not ready: {why or 'it is starting'}")

    async def _server_metadata(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.server_metadata(await self.dataplane.server_metadata()))

    async def _model_metadata(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.model_metadata(await self.dataplane.model_metadata(*args)))

    async def _model_ready(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        if await self.dataplane.model_ready(*args):
            return _EMPTY_OK
        # Not ready is an answer, not a failed request (pollers ask often: nothing is logged).
        # The metadata call raises the error that says why (unknown, loading, ...).
        try:
            await self.dataplane.model_metadata(*args)
        except DlscaleError as exc:
            return error_response(exc.http_status, str(exc))
        return error_response(503, f"model {args[0]!r} is not ready")

    async def _config(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.model_config(await self.dataplane.model_config(*args)))

    # -- inference ---------------------------------------------------------------------------------

    async def _infer(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        model, version = args
        length = header_length(headers)
        most = self.limits.max_tensor_elements
        large = len(body) > OFF_LOOP_BYTES
        if length == 0:
            spec, batched = await self.dataplane.single_input(model, version)
            request, fmt = await off_loop(
                large, decode_raw_request, body, spec, batched, model, version, most
            )
        elif large:
            request, fmt = await off_loop(large, decode_request, body, length, model, version, most)
        else:  # most bodies: decoded here, without a coroutine for `off_loop` per request
            request, fmt = decode_request(body, length, model, version, most)
        request.traceparent = headers.get(TRACEPARENT, "")
        response = await self.dataplane.infer(request)
        encoded = encode_response(response, fmt)
        if encoded.header_length is None:
            return RestResponse(200, encoded.parts)
        return RestResponse(200, encoded.parts, OCTET, length_header(encoded.header_length))

    # -- shared memory (the routes of frontends/rest/shared_memory.py) -----------------------------

    async def _shm(self, args: list[str], headers: Mapping[str, str], body: Buffer) -> RestResponse:
        kind, name, action = args
        # A worker's registry is the owner's, behind a blocking channel: off the event loop.
        remote = self.dataplane.remote
        doc = await off_loop(remote, self.shared_memory.handle, kind, name, action, body)
        return _EMPTY_OK if doc is None else json_response(doc)

    # -- repository and statistics -----------------------------------------------------------------

    async def _index(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        doc = json_object(body, "repository index")
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(
                f"field 'ready' of the index request must be true or false, got {ready!r}"
            )
        return json_response(render.repository_index(await self.dataplane.repository_index(ready)))

    async def _load(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        large = len(body) > 2**18  # a load with files: JSON and base64 decoded in a thread
        await self.dataplane.load_model(args[0], await off_loop(large, load_request, body))
        return _EMPTY_OK

    async def _unload(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        json_object(body, "unload")  # parameters (unload_dependents) have no meaning here
        await self.dataplane.unload_model(args[0])
        return _EMPTY_OK

    async def _stats(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        return json_response(render.statistics(await self.dataplane.statistics(*args)))

    # -- trace and log settings -----------------------------------------------------------------

    async def _trace(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        changes = json_object(body, "trace setting")
        return json_response(await self.dataplane.trace_settings(args[0], changes))

    async def _logging(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        changes = json_object(body, "log setting")
        return json_response(await self.dataplane.log_settings(changes))


async def _ready(response: RestResponse) -> RestResponse:
    return response


def _parts(path: str) -> list[str]:
    """A path's parts without its query, unquoted: '/v2/models/a%20b' -> ['v2', 'models', 'a b']."""
    return [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]


def _short(path: str) -> str:
    """A path for a message, cut short when a client sent a long one."""
    return path if len(path) <= 200 else path[:197] + "..."
