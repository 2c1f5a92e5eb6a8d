"""GrpcFrontend: a grpc.aio server that serves the Open Inference Protocol over a DataPlane."""

from __future__ import annotations

from typing import Any

import grpc

from dlscale.errors import DlscaleError
from dlscale.frontends.grpc.servicer import InferenceServicer
from dlscale.serving.dataplane import DataPlane
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc


class GrpcFrontend:
    """Listens on host:port (0 picks a free port) until stopped."""

    def __init__(
        self,
        dataplane: DataPlane,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        max_message_bytes: int = 64 * 2**20,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"gRPC port {port} is outside 0..65535")
        if not 0 < max_message_bytes < 2**31:
            raise ValueError(f"max_message_bytes {max_message_bytes}: expected 1 .. 2**31 - 1")
        self.dataplane = dataplane
        self.host = host
        self.max_message_bytes = max_message_bytes
        self._requested_port = port
        self._port: int | None = None
        self._server: Any = None

    @property
    def port(self) -> int:
        """The port actually bound (the one the OS chose when asked for 0)."""
        if self._port is None:
            raise RuntimeError("the gRPC frontend has not been started")
        return self._port

    async def start(self) -> None:
        """Bind and start serving; raises DlscaleError when the address cannot be bound."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                # gRPC sets SO_REUSEPORT by default: a second server on a busy port would bind
                # silently and share its traffic instead of failing.
                ("grpc.so_reuseport", 0),
            ]
        )
        servicer = InferenceServicer(self.dataplane, self.max_message_bytes)
        add_servicer = inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
        add_servicer(servicer, server)  # type: ignore[no-untyped-call]
        host = f"[{self.host}]" if ":" in self.host else self.host
        address = f"{host}:{self._requested_port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise DlscaleError(f"gRPC cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise DlscaleError(f"gRPC cannot listen on {address}: address in use or not valid")
        await server.start()
        self._server = server
        self._port = port

    async def stop(self, grace_s: float = 10.0) -> None:
        """Refuse new calls, give those in flight up to grace_s to finish, then close."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
