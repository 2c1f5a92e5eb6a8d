"""The GRPCInferenceService servicer: decode (wire codec), one DataPlane call, encode (convert)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from dlscale.errors import DlscaleError, Unsupported
from dlscale.frontends.grpc import convert
from dlscale.serving.dataplane import DataPlane
from dlscale.wire.grpc import decode_infer_request, wants_raw
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Handler = Callable[["InferenceServicer", Any, Any], Awaitable[_T]]


def _status(exc: DlscaleError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)


def _unary(handler: _Handler[_T]) -> _Handler[_T]:
    """Map the error tree to gRPC status codes; anything else is INTERNAL and logged."""

    @functools.wraps(handler)
    async def wrapped(self: InferenceServicer, request: Any, context: Any) -> _T:
        try:
            return await handler(self, request, context)
        except DlscaleError as exc:
            await context.abort(_status(exc), exc.message)
        except Exception as exc:
            log.exception("gRPC %s failed", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
        raise AssertionError("context.abort returned")  # abort always raises

    return wrapped


class InferenceServicer(inference_pb2_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the service over one DataPlane; no scheduling or validation here."""

    def __init__(self, dataplane: DataPlane, max_message_bytes: int) -> None:
        self.dataplane = dataplane
        self.max_message_bytes = max_message_bytes

    # -- health and metadata ------------------------------------------------------------------

    @_unary
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return convert.server_live(self.dataplane.live())

    @_unary
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return convert.server_ready(self.dataplane.ready())

    @_unary
    async def ModelReady(self, request: Any, context: Any) -> Any:
        return convert.model_ready(self.dataplane.model_ready(*convert.name_version(request)))

    @_unary
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return convert.server_metadata(self.dataplane.server_metadata())

    @_unary
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return convert.model_metadata(self.dataplane.model_metadata(*convert.name_version(request)))

    @_unary
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return convert.model_config(self.dataplane.model_config(*convert.name_version(request)))

    # -- inference ------------------------------------------------------------------------------

    @_unary
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._infer(request, stream=False)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """Answer each request of the stream as it completes; errors travel in-stream."""
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def answer(message: Any) -> None:
            try:
                reply = await self._infer(message, stream=True)
            except DlscaleError as exc:
                reply = convert.stream_error(exc.message, message)
            except Exception as exc:
                log.exception("gRPC ModelStreamInfer request failed")
                reply = convert.stream_error(f"internal error: {exc!r}", message)
            answers.put_nowait(reply)

        async def read() -> None:
            # Requests run concurrently, so that those of one stream can share a batch.
            async for message in requests:
                task = asyncio.create_task(answer(message))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.gather(*running)
            answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await answers.get()) is not None:
                yield reply
            await reader  # re-raises a failure of the request stream itself
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _infer(self, message: Any, stream: bool) -> Any:
        request = decode_infer_request(message)
        response = await self.dataplane.infer(request)
        return convert.infer_response(
            response, wants_raw(request), self.max_message_bytes, stream=stream
        )

    # -- statistics and repository ----------------------------------------------------------------

    @_unary
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return convert.statistics(self.dataplane.statistics(*convert.name_version(request)))

    @_unary
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return convert.repository_index(
            self.dataplane.repository_index(convert.ready_only(request))
        )

    @_unary
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        overrides = convert.load_overrides(request)
        if overrides:
            raise Unsupported(
                f"loading with {overrides} is not supported: put the model and its config.toml "
                "in the repository folder, then load it by name"
            )
        await self.dataplane.load_model(convert.model_name(request))
        return convert.load_done()

    @_unary
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self.dataplane.unload_model(convert.model_name(request))
        return convert.unload_done()
