"""Small helpers around the real clients the tests drive the server with."""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Self

import numpy as np
import tritonclient.grpc as triton


def infer_input(name: str, array: np.ndarray) -> triton.InferInput:
    """A tritonclient gRPC input holding `array` (raw contents, as tritonclient sends them)."""
    datatype = "BYTES" if array.dtype == object else triton.np_to_triton_dtype(array.dtype)
    inp = triton.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


class RawHttp:
    """One HTTP/1.1 connection on a plain socket, for what real clients never send."""

    def __init__(self, port: int, timeout: float = 10.0, source: str = "") -> None:
        # `source`: another loopback address (127.0.0.2, ...), to be another client (peer).
        address = (source, 0) if source else None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout, address)
        self._reader = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        """Send bytes as they are."""
        self.sock.sendall(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """One response; bytes of later (pipelined) responses stay buffered for the next call."""
        status_line = self._reader.readline()
        assert status_line, "connection closed"
        headers = {}
        while (line := self._reader.readline()) not in (b"\r\n", b""):
            name, value = line.decode("latin-1").rstrip("\r\n").split(": ", 1)
            headers[name.lower()] = value
        body = self._reader.read(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        """Whether the server has closed its side (reads end) rather than sent more bytes."""
        try:
            return self._reader.read(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        """Close the connection."""
        self._reader.close()
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
