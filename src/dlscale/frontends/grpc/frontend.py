"""GrpcFrontend: a grpc.aio server that serves the Open Inference Protocol over a DataPlane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from dlscale.errors import DlscaleError
from dlscale.frontends import GRACE_S
from dlscale.frontends.access import GRPC_HEADER_PREFIX, Access
from dlscale.frontends.grpc import tfserving
from dlscale.frontends.grpc.guard import Guard, GuardedServer, decodes_safely, undecodable
from dlscale.frontends.grpc.peers import ConnectionTrimmer, PeerCalls
from dlscale.frontends.grpc.servicer import InferenceServicer
from dlscale.frontends.grpc.writing import written
from dlscale.frontends.limits import Limits
from dlscale.frontends.plane import Asked, Plane
from dlscale.frontends.tls import TlsFiles
from dlscale.wire import tracing
from dlscale.wire.grpc import (
    RAW_INPUT_FIELD,
    RAW_OUTPUT_FIELD,
    SPLIT_FROM_BYTES,
    Framed,
    read_framed,
    serialize,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"


class GrpcFrontend:
    """Listens on host:port (0 picks a free port) until stopped."""

    def __init__(
        self,
        dataplane: Plane,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        limits: Limits | None = None,
        tls: TlsFiles | None = None,
        access: Access | None = None,
        tfserving: bool = False,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"gRPC port {port} is outside 0..65535")
        self.dataplane = dataplane
        self.host = host
        self.limits = limits or Limits()
        self.tls = tls
        self.access = access or Access(header_prefix=GRPC_HEADER_PREFIX)
        self._requested_port = port
        #: Whether TensorFlow Serving's services are asked for (tfserving.py), and then served.
        self.tfserving = tfserving
        self.tfserving_served = False
        self._port: int | None = None
        #: Calls in flight per client address, held to max_connections_per_peer (peers.py).
        self.peers = PeerCalls(self.limits.max_connections_per_peer)
        self._server: Any = None
        #: The servicer, once started (its `outboxes` count what each stream holds).
        self.servicer: InferenceServicer | None = None
        self._trimmer: ConnectionTrimmer | None = None

    @property
    def port(self) -> int:
        """The port actually bound (the one the OS chose when asked for 0)."""
        if self._port is None:
            raise RuntimeError("the gRPC frontend has not been started")
        return self._port

    async def start(self) -> None:
        """Bind and start serving; raises DlscaleError when the address cannot be bound."""
        limits, cap = self.limits, self.limits.max_connections_per_peer
        options = [
            ("grpc.max_receive_message_length", limits.max_grpc_message_bytes),
            ("grpc.max_send_message_length", limits.max_grpc_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second server on a busy port would bind
            # silently and share its traffic instead of failing.
            ("grpc.so_reuseport", 0),
            # The same bounds as REST: connections held, idle time, time to say hello;
            # per client address, peers.py holds calls and connections.
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            ("grpc.max_connection_idle_ms", int(limits.keep_alive_s * 1000)),
            ("grpc.server_handshake_timeout_ms", int(limits.head_timeout_s * 1000)),
        ]
        if cap:
            # One connection's calls at once: a client's channel holds more back itself
            # (HTTP/2), so a single channel never reaches the per-address refusal.
            options.append(("grpc.max_concurrent_streams", cap))
        server = grpc.aio.server(options=options)
        servicer = self.servicer = InferenceServicer(self.dataplane, limits)
        servicer.continues_traces = await _continues_traces(servicer.dataplane)
        handlers = method_handlers(servicer, limits.unread_stream_timeout_s)
        guarded = GuardedServer(server, Guard(self.access, self.peers))
        guarded.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        if self.tfserving:
            self.tfserving_served = tfserving.register(
                guarded, servicer.dataplane, limits.max_tensor_elements
            )
        host = f"[{self.host}]" if ":" in self.host else self.host
        address = f"{host}:{self._requested_port}"
        try:
            if self.tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, self.tls.grpc_credentials())
        except RuntimeError as exc:
            raise DlscaleError(f"gRPC cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise DlscaleError(f"gRPC cannot listen on {address}: address in use or not valid")
        await server.start()
        self._server = server
        self._port = port
        if cap and ConnectionTrimmer.available():
            self._trimmer = ConnectionTrimmer(port, cap)
            self._trimmer.start()

    async def stop(self, grace_s: float = GRACE_S) -> None:
        """Refuse new calls, give those in flight up to grace_s to finish, then close."""
        if self._trimmer is not None:
            self._trimmer.stop()
            self._trimmer = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None


async def _continues_traces(plane: Asked) -> bool:
    """Whether the server traces to OTLP, the one kind of trace a caller's `traceparent`
    continues: fixed when the server starts (its endpoint is a flag), so asked once here."""
    settings = await plane.trace_settings()
    return settings.get("trace_mode") == "opentelemetry"


def method_handlers(
    servicer: InferenceServicer, unread_s: float
) -> dict[str, grpc.RpcMethodHandler]:
    """Every RPC of the service, each with its messages' protobuf (de)serializers, except that
    ModelInfer and ModelStreamInfer keep large raw contents out of protobuf (wire/grpc.py,
    `Framed`): read as views of the received bytes, written joined once. ModelStreamInfer's
    answers are written with a bound on how long a client may leave them unread (`written`)."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        name = method.name
        request_of: Any = getattr(pb, method.input_type.name).FromString
        answer_of: Any = getattr(pb, method.output_type.name).SerializeToString
        behavior: Any = getattr(servicer, name)
        if name in ("ModelInfer", "ModelStreamInfer"):
            request_of = _request_reader(name)
            answer_of = write_stream_answer if name == "ModelStreamInfer" else _write_answer
        if name == "ModelStreamInfer":
            behavior = written(behavior, unread_s)
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = make(
            behavior, request_deserializer=request_of, response_serializer=answer_of
        )
    return handlers


def _request_reader(method: str) -> Callable[[bytes], Any]:
    """`method`'s ModelInferRequests as its handler takes them: whole when small (protobuf's one
    parse costs less than a split), `Framed` when large; `Undecodable` when not such a message
    (the guard refuses it INVALID_ARGUMENT), caught here rather than by a wrapper around this."""

    @decodes_safely
    def read(data: bytes) -> Any:
        tracing.record(tracing.SOCKET_IN, data)  # gRPC's own copy of what the socket read
        try:
            if len(data) < SPLIT_FROM_BYTES:
                return request_of(data)
            return read_framed(data, pb.ModelInferRequest, RAW_INPUT_FIELD)
        except Exception as exc:  # protobuf raises DecodeError; anything else is as undecodable
            return undecodable(method, exc)

    request_of = pb.ModelInferRequest.FromString
    return read


def _write_answer(answer: Framed, stream: bool = False) -> bytes:
    data = serialize(answer, RAW_OUTPUT_FIELD, stream)
    tracing.record(tracing.SOCKET_OUT, data)
    return data


def write_stream_answer(answer: Framed | Any) -> bytes:
    """A stream's answer: a ModelInferResponse wrapped in place, or an in-stream error message."""
    if isinstance(answer, Framed):
        return _write_answer(answer, stream=True)
    return bytes(answer.SerializeToString())
