"""The gate every gRPC call passes: restricted API groups, and messages that cannot be decoded.

gRPC decodes a request before the servicer sees it and answers UNKNOWN when it cannot; this
interceptor makes that the client's mistake (INVALID_ARGUMENT, with what failed) and checks
Triton's restricted-protocol header (PERMISSION_DENIED). Each method's wrapped handler is
made once and reused, so a call pays one dictionary lookup here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from dlscale.errors import PermissionDenied
from dlscale.frontends.access import Access, grpc_group


@dataclass(frozen=True)
class Undecodable:
    """What the safe deserializer hands on instead of a message it could not parse."""

    error: str


class Guard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps each method's handler: decode errors and restricted groups answered here."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._handlers: dict[str, Any] = {}

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        method = details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = await continuation(details)
            if handler is None:
                return None  # unknown method: gRPC answers UNIMPLEMENTED
            handler = self._wrap(handler, method)
            self._handlers[method] = handler
        return handler

    def _wrap(self, handler: Any, method: str) -> Any:
        name = method.rpartition("/")[2]
        group = grpc_group(method)
        check = self._checker(group)
        changes: dict[str, Any] = {
            "request_deserializer": _safe(handler.request_deserializer, name)
        }
        if handler.unary_unary is not None:
            changes["unary_unary"] = _unary(handler.unary_unary, check)
        elif handler.stream_stream is not None:
            changes["stream_stream"] = _stream(handler.stream_stream, check)
        else:
            return handler  # the service has no other kinds; leave any new one as it is
        return handler._replace(**changes)

    def _checker(self, group: str) -> Callable[[Any], Awaitable[None]] | None:
        if not self.access:
            return None
        access = self.access

        async def check(context: Any) -> None:
            headers = {k.lower(): v for k, v in context.invocation_metadata() or ()}
            try:
                access.check(group, headers)
            except PermissionDenied as exc:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)

        return check


def _safe(deserialize: Callable[[bytes], Any] | None, name: str) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf raises DecodeError; anything else is as undecodable
            return Undecodable(f"the {name} request is not a valid protobuf message: {exc}")

    return decode


def _unary(
    behavior: Callable[[Any, Any], Awaitable[Any]], check: Callable[[Any], Awaitable[None]] | None
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def guarded(request: Any, context: Any) -> Any:
        if check is not None:
            await check(context)
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        return await behavior(request, context)

    return guarded


def _stream(
    behavior: Callable[[Any, Any], Awaitable[None]],
    check: Callable[[Any], Awaitable[None]] | None,
) -> Callable[[Any, Any], Awaitable[None]]:
    # A stream's handler writes its own answers (writing.py): it is awaited, not iterated.
    async def guarded(requests: AsyncIterator[Any], context: Any) -> None:
        if check is not None:
            await check(context)
        await behavior(_decoded(requests, context), context)

    return guarded


async def _decoded(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        yield request
