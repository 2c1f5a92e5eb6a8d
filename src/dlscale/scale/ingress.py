"""The Open Inference Protocol on Ray Serve: dlscale's REST routes and gRPC servicer, one router.

Ray Serve's HTTP proxy hands each request to `__call__`, which feeds dlscale's socket-free REST
routes (`frontends.rest.api.RestApi`); its gRPC proxy calls the method named after each RPC of
`inference.GRPCInferenceService`, which runs dlscale's servicer. Both sit on the same `Router`,
so the routes, codec, errors and statistics are those of `dlscale serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from google.protobuf import message_factory
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from dlscale.errors import Unavailable
from dlscale.frontends.grpc.servicer import InferenceServicer
from dlscale.frontends.limits import Limits
from dlscale.frontends.rest.api import RestApi, RestResponse, error_response
from dlscale.scale.deploy import INGRESS_APP, QUIET
from dlscale.scale.router import Router
from dlscale.scale.settings import ScaleSettings
from dlscale.wire.grpc import RAW_OUTPUT_FIELD, Framed
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

log = logging.getLogger("dlscale.scale")

_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


class OipIngress:
    """The ingress deployment: REST over Ray Serve's HTTP proxy, gRPC over its gRPC proxy."""

    # Ray Serve awaits an async constructor on the replica's event loop (see replica.py).
    async def __init__(  # type: ignore[misc]
        self,
        settings: ScaleSettings,
        failed: dict[str, str] | None = None,
        pending: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.router = Router(settings, failed, pending)
        await self.router.refresh()
        self.rest = RestApi(self.router, Limits(max_body_bytes=settings.max_body_bytes))
        self.grpc = InferenceServicer(self.router, settings.max_grpc_message_bytes)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s)
            try:
                await self.router.refresh()
            except Exception:  # Serve's controller restarting: try again next time
                log.exception("reading the deployments' states from Ray Serve failed")

    async def __del__(self) -> None:
        """Ray Serve's graceful stop: refuse new requests; those in flight finish."""
        self.router.stop_accepting()
        self._refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._refresher

    # -- REST ------------------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        """One HTTP request through dlscale's REST routes."""
        body = await request.body()
        limit = self.settings.max_body_bytes
        if len(body) > limit:
            answer = error_response(
                413, f"the request body of {len(body)} bytes exceeds the limit of {limit} bytes"
            )
        else:
            # The raw path: the routes unquote each segment themselves, as on one host.
            raw = request.scope.get("raw_path") or request.url.path.encode()
            path = raw.decode("latin-1")
            headers = {k.lower(): v for k, v in request.headers.items()}
            answer = await self.rest.handle(request.method, path, headers, body)
        return _http_response(answer)

    # -- gRPC: one method per RPC of inference.GRPCInferenceService -----------------------------

    async def ServerLive(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ServerLive", request, grpc_context)

    async def ServerReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ServerReady", request, grpc_context)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ModelReady", request, grpc_context)

    async def ServerMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ServerMetadata", request, grpc_context)

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ModelMetadata", request, grpc_context)

    async def ModelConfig(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ModelConfig", request, grpc_context)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ModelInfer", request, grpc_context)

    async def ModelStatistics(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("ModelStatistics", request, grpc_context)

    async def RepositoryIndex(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("RepositoryIndex", request, grpc_context)

    async def RepositoryModelLoad(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("RepositoryModelLoad", request, grpc_context)

    async def RepositoryModelUnload(self, request: Any, grpc_context: Any) -> Any:
        return await self._unary("RepositoryModelUnload", request, grpc_context)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], grpc_context: Any
    ) -> AsyncIterator[Any]:
        """The bidirectional stream: errors travel in-stream, as on one host."""
        async for reply in self.grpc.ModelStreamInfer(requests, _Context(grpc_context)):
            if isinstance(reply, Framed):  # Ray's proxy serializes whole protobuf messages
                reply = pb.ModelStreamInferResponse(infer_response=reply.whole(RAW_OUTPUT_FIELD))
            yield reply

    async def _unary(self, rpc: str, request: Any, grpc_context: Any) -> Any:
        """Run the servicer's method; an error leaves its status on Ray's context."""
        try:
            reply = await getattr(self.grpc, rpc)(request, _Context(grpc_context))
        except _Aborted:
            # Ray Serve sends the status set on its context; the message itself is not sent.
            return message_factory.GetMessageClass(_SERVICE.methods_by_name[rpc].output_type)()
        # Ray's proxy serializes whole protobuf messages: raw outputs go back inside.
        return reply.whole(RAW_OUTPUT_FIELD) if isinstance(reply, Framed) else reply


def _http_response(answer: RestResponse) -> Response:
    if answer.stream is not None:  # server-sent events: each chunk as the model sends it
        return StreamingResponse(
            answer.stream,
            status_code=answer.status,
            headers=dict(answer.headers),
            media_type=answer.content_type,
        )
    return Response(
        content=b"".join(answer.parts),
        status_code=answer.status,
        headers=dict(answer.headers),
        media_type=answer.content_type,
    )


class _Aborted(Exception):
    """The servicer aborted the call; its status is on Ray's context."""


class _Context:
    """The servicer's view of Ray Serve's gRPC context: `abort` sets the status and stops."""

    def __init__(self, context: Any) -> None:
        self.context = context

    async def abort(self, code: Any, details: str) -> NoReturn:
        self.context.set_code(code)
        self.context.set_details(details)
        raise _Aborted(details)

    def invocation_metadata(self) -> Any:
        """The caller's metadata (its `traceparent` continues an OTLP trace)."""
        return self.context.invocation_metadata()


def deploy_ingress(
    settings: ScaleSettings, failed: dict[str, str] | None = None, pending: tuple[str, ...] = ()
) -> None:
    """Deploy the Open Inference Protocol ingress on route `/`; returns once it runs.

    `failed`: models that could not be deployed, and why (the repository index shows it);
    `pending`: models deployed after it (the server is live meanwhile, and not ready).
    """
    deployment = serve.deployment(
        name="OipIngress",
        num_replicas=settings.ingress_replicas,
        # The ingress only decodes, routes and encodes; it waits on replicas most of the time.
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1024,
        logging_config=QUIET,
    )(OipIngress)
    try:
        serve.run(
            deployment.bind(settings, failed or {}, pending), name=INGRESS_APP, route_prefix="/"
        )
    except RuntimeError as exc:
        raise Unavailable(f"the ingress failed to deploy on Ray Serve: {exc}") from None
