"""The REST routes on other HTTP servers (uvicorn, granian), for the stack measurement only.

dlscale's frontend runs `RestApi` on its own httptools transport; these adapters run the same
`RestApi` under the candidates it was measured against (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from dlscale.frontends.rest.api import RestApi, error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def asgi_app(api: RestApi) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A minimal ASGI application over `api` (no framework: the fastest ASGI can be)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > api.max_body_bytes:
            response = error_response(413, "the request body exceeds the limit")
        else:
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            response = await api.handle(scope["method"], scope["path"], headers, body)
        payload = b"".join(response.parts)
        out = [
            (b"content-type", response.content_type.encode()),
            (b"content-length", str(len(payload)).encode()),
        ]
        out += [(k.encode(), v.encode()) for k, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        await send({"type": "http.response.body", "body": payload})

    return app


def rsgi_app(api: RestApi) -> Callable[[Any, Any], Awaitable[None]]:
    """An RSGI application (granian's native interface, cheaper than ASGI) over `api`."""

    async def app(scope: Any, proto: Any) -> None:
        headers = {k.lower(): v for k, v in scope.headers.items()}
        body = await proto()
        response = await api.handle(scope.method, scope.path, headers, body)
        out = [("content-type", response.content_type), *response.headers]
        proto.response_bytes(response.status, out, b"".join(response.parts))

    return app
