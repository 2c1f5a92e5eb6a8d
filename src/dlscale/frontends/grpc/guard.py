"""The gate every gRPC call passes: the API key, restricted groups, the calls one client may
have in flight, and messages that cannot be decoded.

gRPC decodes a request before the servicer sees it and answers UNKNOWN when it cannot; this
interceptor makes that the client's mistake (INVALID_ARGUMENT, with what failed), checks the
API key (`authorization: Bearer KEY` metadata, UNAUTHENTICATED) and Triton's restricted-protocol
header (PERMISSION_DENIED), and holds each client address to its calls in flight (peers.py,
RESOURCE_EXHAUSTED; health calls are never held back). Each method's wrapped handler is made
once, as the services register (`GuardedServer`), not by a grpc.aio interceptor: grpc.aio runs
an interceptor's coroutines on every call, which cost a [1, 16] request about a tenth of its
server CPU.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dlscale.errors import DlscaleError
from dlscale.frontends.access import Access, grpc_group
from dlscale.frontends.grpc.peers import PeerCalls, address_of, peer_address

#: Checks a call's context before it runs; aborts the call to refuse it.
_Check = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True)
class Undecodable:
    """What the safe deserializer hands on instead of a message it could not parse."""

    error: str


class Guard:
    """Wraps each method's handler: decode errors, access and per-client calls answered here."""

    def __init__(self, access: Access, peers: PeerCalls) -> None:
        self.access = access
        self.peers = peers

    def wrap(self, handler: Any, method: str) -> Any:
        """`handler` of `method` (`/package.Service/Method`), guarded."""
        name = method.rpartition("/")[2]
        group = grpc_group(method)
        check = self._checker(group)
        peers = None if group == "health" or not self.peers.cap else self.peers
        changes: dict[str, Any] = {
            "request_deserializer": _safe(handler.request_deserializer, name)
        }
        if handler.unary_unary is not None:
            changes["unary_unary"] = _unary(handler.unary_unary, check, peers)
        elif handler.stream_stream is not None:
            changes["stream_stream"] = _stream(handler.stream_stream, check, peers)
        else:
            return handler  # the service has no other kinds; leave any new one as it is
        return handler._replace(**changes)

    def _checker(self, group: str) -> _Check | None:
        if not self.access:
            return None
        access = self.access

        async def check(context: Any) -> None:
            headers = {k.lower(): v for k, v in context.invocation_metadata() or ()}
            try:
                access.check(group, headers)
            except DlscaleError as exc:  # UNAUTHENTICATED or PERMISSION_DENIED
                await context.abort(grpc.StatusCode[exc.grpc_code], exc.message)

        return check


class GuardedServer:
    """What the services register on: each of their handlers reaches the grpc.aio server
    guarded. Takes the two calls generated `add_*_to_server` functions make, and serves every
    method through the generic handlers (the same handlers, looked up by name on each call).

    No method reaches grpc.aio as a registered method: grpc.aio keeps one pending request per
    registered method and waits on all of them (and the generic one) with `asyncio.wait` for
    every call it accepts, which with the inference service's 20 methods cost a [1, 16]
    ModelInfer about a tenth of its instructions (docs/serving-grpc.md)."""

    def __init__(self, server: grpc.aio.Server, guard: Guard) -> None:
        self.server = server
        self.guard = guard

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Register services whose methods are looked up per call (each guarded once)."""
        self.server.add_generic_rpc_handlers(tuple(_Guarded(self.guard, h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Served by the generic handlers the same services add (see the class): nothing to
        register."""


class _Guarded(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose methods come out guarded, each wrapped on its first call."""

    def __init__(self, guard: Guard, inner: grpc.GenericRpcHandler) -> None:
        self.guard = guard
        self.inner = inner
        self._handlers: dict[str, Any] = {}

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = self.inner.service(handler_call_details)
            if handler is None:
                return None  # not this service's method (none's: gRPC answers UNIMPLEMENTED)
            handler = self._handlers[method] = self.guard.wrap(handler, method)
        return handler


#: Deserializers that answer `Undecodable` themselves (`decodes_safely`): used as they are.
_SAFE: set[Callable[[bytes], Any]] = set()


def decodes_safely(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """Mark a deserializer that returns `undecodable(...)` for bytes it cannot parse, so that
    the guard calls it directly, without a wrapper's frame on every call."""
    _SAFE.add(deserialize)
    return deserialize


def undecodable(name: str, exc: Exception) -> Undecodable:
    """What a `name` request that failed to parse with `exc` is handed on as."""
    return Undecodable(f"the {name} request is not a valid protobuf message: {exc}")


def _safe(deserialize: Callable[[bytes], Any] | None, name: str) -> Callable[[bytes], Any]:
    if deserialize in _SAFE:
        return deserialize  # in _SAFE: not None

    def decode(data: bytes) -> Any:
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf raises DecodeError; anything else is as undecodable
            return undecodable(name, exc)

    return decode


def _unary(
    behavior: Callable[[Any, Any], Awaitable[Any]], check: _Check | None, peers: PeerCalls | None
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def guarded(request: Any, context: Any) -> Any:
        if check is not None:
            await check(context)
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        if peers is None:
            return await behavior(request, context)
        # Counted in here, not in a coroutine of its own: this runs on every call.
        peer = address_of(context.peer() or "")
        refusal = peers.enter(peer)
        if refusal is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            return await behavior(request, context)
        finally:
            peers.leave(peer)

    return guarded


def _stream(
    behavior: Callable[[Any, Any], Awaitable[None]],
    check: _Check | None,
    peers: PeerCalls | None,
) -> Callable[[Any, Any], Awaitable[None]]:
    # A stream's handler writes its own answers (writing.py): it is awaited, not iterated.
    async def guarded(requests: AsyncIterator[Any], context: Any) -> None:
        if check is not None:
            await check(context)
        peer = None
        if peers is not None:  # counted in for its client address, or refused
            peer = peer_address(context.peer() or "")
            refusal = peers.enter(peer)
            if refusal is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            await behavior(_decoded(requests, context), context)
        finally:
            if peers is not None and peer is not None:
                peers.leave(peer)

    return guarded


async def _decoded(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        yield request
