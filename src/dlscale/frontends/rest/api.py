"""The Open Inference Protocol REST routes: one request in, one DataPlane call, one response out.

This module knows paths, methods and bodies but no socket: the HTTP transport (`transport.py`)
feeds it parsed requests, and any other server (an ASGI one, a test) can do the same. Tensors
are decoded and encoded by the wire codec (`dlscale.wire.rest`), answers rendered by `render`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Mapping

from dlscale.errors import DlscaleError, clipped
from dlscale.frontends.access import Access
from dlscale.frontends.limits import Limits
from dlscale.frontends.offload import OFF_LOOP_BYTES, off_loop
from dlscale.frontends.plane import Asked, Plane
from dlscale.frontends.rest import shared_memory
from dlscale.frontends.rest.control_routes import ControlRoutes
from dlscale.frontends.rest.documents import decoded_body, header_length, length_header
from dlscale.frontends.rest.generate import GenerateApi
from dlscale.frontends.rest.openai.routes import OpenAIApi
from dlscale.frontends.rest.responses import ROUTE_CACHE_SIZE, Handler, failure_response, path_parts
from dlscale.frontends.rest.responses import RestResponse as RestResponse
from dlscale.frontends.rest.responses import error_response as error_response
from dlscale.frontends.rest.tfserving import TfServingApi
from dlscale.serving.observe.logs import access
from dlscale.serving.observe.otel import TRACEPARENT
from dlscale.wire.rest import (
    decode_raw_request,
    decode_request,
    encode_response,
)
from dlscale.wire.tensors import Buffer

OCTET = "application/octet-stream"

#: A route: its handler (None: no route), path arguments, the one method, and its API group.
_Route = tuple[Handler | None, list[str], str, str]


class RestApi:
    """Routes REST requests to the DataPlane and maps every DlscaleError to its status."""

    def __init__(
        self, dataplane: Plane, limits: Limits | None = None, access: Access | None = None
    ) -> None:
        self.dataplane = Asked(dataplane)
        self.limits = limits or Limits()
        self.access = access or Access()
        #: Whether any API group needs a key or a header (fixed at start): none, no check.
        self._guarded = bool(self.access)
        self.control = ControlRoutes(self.dataplane)
        self.generate = GenerateApi(self.dataplane, self.limits)
        #: The body with its Content-Encoding undone (the OpenAI routes' too).
        self._decoded = functools.partial(decoded_body, max_bytes=self.limits.max_body_bytes)
        self._routes: dict[str, _Route] = {}
        self.openai = OpenAIApi(self.dataplane, self.access, self._decoded)
        #: TensorFlow Serving's routes, under /v1/ beside OpenAI's: called as OIP's are.
        self.tfserving = TfServingApi(self.dataplane, self.limits)
        #: The handlers whose model may refuse a request before its body is read.
        self._inference = (
            self._infer,
            self.generate.generate,
            self.generate.generate_stream,
            self.tfserving.infer,
        )

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
                return failure_response(f"{method} {path}", route[1][0] if route[1] else "", exc)
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
        args: list[str] = []
        try:
            if self.openai.serves(path):  # the OpenAI API's; under /v1/, TensorFlow Serving's too
                found = self.tfserving.route(path)
                if found is None or await self.tfserving.openai_asks(found):
                    # In OpenAI's own errors' shape (docs/openai.md).
                    return await self.openai.handle(method, path, headers, body)
                route: _Route = found
            else:
                route = self._route(path)
            args = route[1]
            if route[0] is None:
                return error_response(404, f"no route for {clipped(path, 200)!r}")
            return await self._call(route, method, path, headers, body)
        except Exception as exc:
            return failure_response(f"{method} {path}", args[0] if args else "", exc)

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
                    f"{method} is not allowed on {clipped(path, 200)!r}; use {allowed}",
                    (("allow", allowed),),
                )
            )
        if "content-encoding" in headers:  # most requests have none: no call
            body = self._decoded(headers, body)
        return handler(args, headers, body)

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
            route = self.tfserving.route(path)
            if route is None:
                return self.openai.refusal_before_body(method, path, headers)
            if self.tfserving.shared(route):
                return None  # OpenAI's or TensorFlow Serving's: `handle` tells which
        handler, args, _, group = route or self._route(path)
        if handler is None:
            return None  # `handle` answers 404
        if self._guarded:
            try:
                self.access.check(group, headers)
            except DlscaleError as exc:
                return failure_response(f"{method} {path}", "", exc, challenge=True)
        if method != "POST" or handler not in self._inference:
            return None
        refusal = self.dataplane.refuse_early(args[0], args[1])
        if refusal is None:
            return None
        return failure_response(f"{method} {path}", args[0], refusal, challenge=True)

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
            found = self._resolve(path)
            if found[0] is not None:
                if len(self._routes) >= ROUTE_CACHE_SIZE:
                    self._routes.clear()
                self._routes[path] = found
        return found

    def _resolve(self, path: str) -> _Route:
        parts = path_parts(path)
        # /metrics shows what the statistics extension shows: it is guarded as that.
        if parts == ["metrics"]:  # vLLM's API port serves its metrics here
            return self.control.metrics, [], "GET", "statistics"
        if not parts or parts[0] != "v2":
            return None, [], "", ""
        rest = parts[1:]
        match rest:
            case []:
                return self.control.server_metadata, [], "GET", "metadata"
            case ["health", "live"]:
                return self.control.live, [], "GET", "health"
            case ["health", "ready"]:
                return self.control.ready, [], "GET", "health"
            case ["logging"]:
                return self.control.logging, [], "GET, POST", "logging"
            case ["trace", "setting"]:
                return self.control.trace, [""], "GET, POST", "trace"
            case ["models", "stats"]:
                return self.control.stats, ["", ""], "GET", "statistics"
            case ["repository", "index"]:
                return self.control.index, [], "POST", "model-repository"
            case ["repository", "models", model, "load"]:
                return self.control.load, [model], "POST", "model-repository"
            case ["repository", "models", model, "unload"]:
                return self.control.unload, [model], "POST", "model-repository"
            case [prefix, *tail] if prefix in shared_memory.PREFIXES:
                found = shared_memory.route(prefix, tail)
                return (self.control.shm, *found, "shared-memory") if found else (None, [], "", "")
            case ["models", model, *tail]:
                version = ""
                if tail[:1] == ["versions"] and len(tail) >= 2:
                    version, tail = tail[1], tail[2:]
                return self._model_route(model, version, tail)
        return None, [], "", ""

    def _model_route(self, model: str, version: str, tail: list[str]) -> _Route:
        args = [model, version]
        match tail:
            case []:
                return self.control.model_metadata, args, "GET", "metadata"
            case ["ready"]:
                return self.control.model_ready, args, "GET", "health"
            case ["infer"]:
                return self._infer, args, "POST", "inference"
            case ["generate"]:
                return self.generate.generate, args, "POST", "inference"
            case ["generate_stream"]:
                return self.generate.generate_stream, args, "POST", "inference"
            case ["stats"]:
                return self.control.stats, args, "GET", "statistics"
            case ["config"]:
                return self.control.config, args, "GET", "model-config"
            case ["trace", "setting"] if not version:
                return self.control.trace, [model], "GET, POST", "trace"
        return None, [], "", ""

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


async def _ready(response: RestResponse) -> RestResponse:
    return response
