"""How the services reach grpc.aio (frontends/grpc/guard.py, `GuardedServer`): every method
through the guarded generic handlers, none as a registered method (grpc.aio waits on one pending
request per registered method for every call it accepts)."""

from __future__ import annotations

from typing import Any

import grpc

from dlscale.frontends.access import GRPC_HEADER_PREFIX, Access
from dlscale.frontends.grpc.guard import Guard, GuardedServer
from dlscale.frontends.grpc.peers import PeerCalls
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc

SERVICE = "inference.GRPCInferenceService"


class _Recording:
    """Takes what a grpc.aio server is given, by kind."""

    def __init__(self) -> None:
        self.generic: list[Any] = []
        self.registered: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered.update({f"/{service}/{name}": h for name, h in handlers.items()})


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _servicer() -> Any:
    # The generated base class: its methods answer UNIMPLEMENTED, enough to be registered.
    return inference_pb2_grpc.GRPCInferenceServiceServicer()


def test_every_method_is_served_guarded_by_the_generic_handler_and_none_registered() -> None:
    server = _Recording()
    guarded = GuardedServer(server, Guard(Access(header_prefix=GRPC_HEADER_PREFIX), PeerCalls(4)))
    servicer = _servicer()
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, guarded)

    assert server.registered == {}
    [generic] = server.generic
    for name in ("ModelInfer", "ModelStreamInfer", "ServerLive", "ModelStatistics"):
        handler = generic.service(_Details(f"/{SERVICE}/{name}"))
        assert handler is not None, name
        behavior = handler.unary_unary or handler.stream_stream
        assert behavior is not getattr(servicer, name), f"{name} is not guarded"
        assert generic.service(_Details(f"/{SERVICE}/{name}")) is handler  # wrapped once
    assert generic.service(_Details(f"/{SERVICE}/NoSuchMethod")) is None  # UNIMPLEMENTED
    assert isinstance(generic, grpc.GenericRpcHandler)
