"""A TCP relay whose connections to the server leave from another loopback address.

gRPC clients cannot choose their source address; a test that needs a second client address
(127.0.0.2) points the client at this relay, which listens on 127.0.0.1 and connects on to the
server from the address it was given. Bytes pass unchanged, in both directions.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class Relay:
    """Relays connections from 127.0.0.1:`port` to `target`, leaving from `source`."""

    def __init__(self, target: tuple[str, int], source: str) -> None:
        self.target = target
        self.source = source
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    @property
    def url(self) -> str:
        """host:port for a client."""
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> Self:
        self._spawn(self._accept)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.socket()
            server.bind((self.source, 0))
            try:
                server.connect(self.target)
            except OSError:
                client.close()
                server.close()
                continue
            self._sockets += [client, server]
            self._spawn(_pump, client, server)
            self._spawn(_pump, server, client)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
