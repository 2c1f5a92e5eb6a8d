"""gRPC holds each client address to its share (max_connections_per_peer), as REST does.

The attack (issue 33): one address opens more connections, or more calls, than its share; a
client from another address (127.0.0.2, through tests/toolkit/relay.py) must still be served.
Before the fix gRPC's only connection limit was server-wide: idle connections from one address
made it close every other client's connection at once.
"""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.toolkit.models import write_null_model
from tests.toolkit.relay import Relay
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.waiting import until
from tritonclient.utils import InferenceServerException

from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

ECHO = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
#: A server-wide cap the flood exceeds, and a per-peer share well under it.
MOST, SHARE = 24, 4
#: Only a safety net: a hang fails the test instead of blocking forever.
PATIENCE_S = 60.0
#: HTTP/2's client preface and an empty SETTINGS frame, then the ACK of the server's SETTINGS:
#: a connection past its handshake, which gRPC holds until it has been idle keep_alive_s.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("peers")
    write_null_model(root, "echo", ECHO)
    limits = {"max_connections": MOST, "max_connections_per_peer": SHARE, "keep_alive_s": 600.0}
    with serving(root, **limits) as running:
        yield running


@pytest.fixture
def other(server: LocalServer) -> Iterator[Relay]:
    """A second client address: 127.0.0.2, relayed to the server."""
    host, port = server.grpc_url.split(":")
    with Relay((host, int(port)), "127.0.0.2") as relay:
        yield relay


def _served(url: str) -> bool:
    """Whether a new client at `url` gets an inference answered (a new channel each time, so
    that no reconnection backoff of an earlier try stands in the way)."""
    client = tg.InferenceServerClient(url)
    x = tg.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    try:
        return client.infer("echo", [x], client_timeout=10).as_numpy("y").shape == (1, 2)
    except InferenceServerException:
        return False
    finally:
        client.close()


def _open(sock: socket.socket) -> bool:
    """Whether the server still holds this connection (no end of stream seen)."""
    sock.setblocking(False)
    try:
        while chunk := sock.recv(65536):  # the server's SETTINGS and ACK: read past them
            del chunk
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_idle_connections_of_one_address_leave_room_for_another(
    server: LocalServer, other: Relay
) -> None:
    host, port = server.grpc_url.split(":")
    flood = []
    try:
        for _ in range(MOST + 8):  # more than the whole server may hold, all from 127.0.0.1
            sock = socket.create_connection((host, int(port)), timeout=PATIENCE_S)
            flood.append(sock)
            sock.sendall(PREFACE)
            if sock.recv(65536):  # the server's SETTINGS (none: it closed this one at once)
                sock.sendall(SETTINGS_ACK)
        until(lambda: _served(other.url))
        until(lambda: sum(_open(s) for s in flood) <= SHARE)
    finally:
        for sock in flood:
            sock.close()


_Requests = queue.Queue[pb.ModelInferRequest | None]


def _stream(channel: grpc.Channel) -> tuple[_Requests, Iterator[pb.ModelStreamInferResponse]]:
    """A ModelStreamInfer stream held open, one request answered: its requests and answers."""
    requests: _Requests = queue.Queue()
    call = channel.stream_stream(
        STREAM,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    answers = call(iter(requests.get, None), timeout=PATIENCE_S)
    request = pb.ModelInferRequest(model_name="echo")
    x = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    x.contents.fp32_contents.extend([1.0, 2.0])
    requests.put(request)
    return requests, answers


def test_streams_of_one_address_beyond_its_share_are_refused(
    server: LocalServer, other: Relay
) -> None:
    first = grpc.insecure_channel(server.grpc_url)  # one connection, with its share of streams
    second = grpc.insecure_channel(server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])
    held = [_stream(first) for _ in range(SHARE)]
    try:
        for _, answers in held:  # each stream answered: each is running on the server
            assert not next(answers).error_message
        _, answers = _stream(second)  # another connection from the same address
        with pytest.raises(grpc.RpcError) as refused:
            next(answers)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        assert "max_connections_per_peer" in refused.value.details()  # type: ignore[attr-defined]
        assert not _served(server.grpc_url)  # unary calls count too
        assert _served(other.url)  # another address is not held back
        assert tg.InferenceServerClient(server.grpc_url).is_server_live()  # nor are probes
        # One more on the first connection waits for a stream of its own to end (HTTP/2's
        # concurrent streams), instead of being refused.
        requests, waiting = _stream(first)
        held[0][0].put(None)
        assert not next(waiting).error_message
        requests.put(None)
    finally:
        for requests, _ in held:
            requests.put(None)
        first.close()
        second.close()
    until(lambda: _served(server.grpc_url))  # its streams ended: 127.0.0.1 is served again
