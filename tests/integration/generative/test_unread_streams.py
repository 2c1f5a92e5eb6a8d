"""Clients that open a streamed answer and never read it (issue 33): REST generate_stream and
gRPC ModelStreamInfer. Such a stream is cut once unread for unread_stream_timeout_s, its
sequence cancelled and its seat freed, so other clients are served; the answers one gRPC stream
may leave waiting are bounded; a request id is bounded, as every event echoes it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.toolkit.python_models import write_python_model
from tests.toolkit.server import HOST, LocalServer, serving
from tests.toolkit.waiting import until

from dlscale.frontends.grpc.outbox import Outbox
from dlscale.wire.bounds import MAX_ID_CHARS
from dlscale.wire.generative import signature_toml
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

#: A safety net for anything here on a loaded machine; a hang fails instead of blocking.
PATIENCE_S = 60.0
#: How long a stream may go unread here (the flag's default is 30 s).
UNREAD_S = 1.0
#: Each model's seats: both are taken by clients that do not read.
SEATS = 2
MAX_ANSWERS = 4
MAX_REQUESTS = 8
#: Elements of each answer: 16 KiB raw, about 8 KiB as a JSON event.
ANSWER_ELEMENTS = 4096
#: Answers of one silent stream: far more than the socket buffers take (tcp_wmem's 4 MiB).
MANY = 1200
#: Requests sent on one gRPC stream whose answers are not read.
SENT = 400

#: COUNT answers of ANSWER_ELEMENTS zeros each.
GUSH = f"""
import time

import numpy as np


class Model:
    def stream(self, inputs):
        for _ in range(int(inputs["COUNT"][0])):
            yield {{"OUT": np.zeros({ANSWER_ELEMENTS}, np.int32)}}
            time.sleep(0.0005)
"""

#: One answer of ANSWER_ELEMENTS zeros (it does not stream).
BIG = f"""
import numpy as np


class Model:
    def infer(self, inputs):
        return {{"OUT": np.zeros({ANSWER_ELEMENTS}, np.int32)}}
"""

#: A generative model (backends/generative/contract.py): max_tokens tokens, each the prompt.
CHATTER = """
import numpy as np


class Model:
    def stream(self, inputs, parameters):
        prompt = inputs["text_input"][0].decode()
        most = int(parameters.get("max_tokens", 16))
        for n in range(1, most + 1):
            out = {
                "text_output": np.array([prompt.encode()], dtype=object),
                "num_input_tokens": np.array([1], np.uint32),
                "num_output_tokens": np.array([n], np.uint32),
            }
            if n == most:
                out["finish_reason"] = np.array([b"length"], dtype=object)
            yield out
"""

#: A generative model's seats are its engine's sequences (128 unless it says).
SEQUENCES = f"[backend_options]\nmax_num_seqs = {SEATS}\n"

TOML = f"""
[[inputs]]
name = "COUNT"
datatype = "INT32"
shape = [1]
[[outputs]]
name = "OUT"
datatype = "INT32"
shape = [{ANSWER_ELEMENTS}]
[[instances]]
count = {SEATS}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("unread")
    write_python_model(root, "gush", GUSH, TOML)
    write_python_model(root, "big", BIG, TOML)
    write_python_model(
        root, "chatter", CHATTER, signature_toml() + TOML[TOML.index("[[instances]]") :] + SEQUENCES
    )
    bounds = {"max_stream_answers": MAX_ANSWERS, "max_stream_requests": MAX_REQUESTS}
    with serving(root, unread_stream_timeout_s=UNREAD_S, **bounds) as running:
        yield running


def _running(server: LocalServer, model: str = "gush") -> int:
    seats = server.dataplane.manager.get(model).runner.seats
    assert seats is not None
    return seats.running


def _generate_url(server: LocalServer) -> str:
    return f"http://{server.http_url}/v2/models/gush/generate_stream"


# -- REST --------------------------------------------------------------------------------------


def _silent_stream(server: LocalServer, body: bytes, path: str) -> socket.socket:
    """A connection with a tiny receive buffer that asks for a stream and never reads it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((HOST, int(server.http_url.rpartition(":")[2])))
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _read_until_closed(sock: socket.socket) -> None:
    """Read what the server sent until it closed the connection (reset or end of file); a
    connection the server keeps fails with a timeout."""
    sock.settimeout(PATIENCE_S)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass


def test_rest_streams_left_unread_are_cut_and_free_their_seats(server: LocalServer) -> None:
    body = json.dumps({"COUNT": MANY, "id": "i" * MAX_ID_CHARS}).encode()
    path = "/v2/models/gush/generate_stream"
    silent = [_silent_stream(server, body, path) for _ in range(SEATS)]
    try:
        until(lambda: _running(server) == SEATS)  # every seat held by a client that does not read
        # A client on a fresh connection is answered: the silent streams are cut, not waited on.
        answer = httpx.post(_generate_url(server), json={"COUNT": 3}, timeout=PATIENCE_S)
        assert answer.status_code == 200 and answer.text.count("data: ") == 3
        until(lambda: _running(server) == 0)
        for sock in silent:
            _read_until_closed(sock)
    finally:
        for sock in silent:
            sock.close()


def test_openai_streams_left_unread_are_cut_and_free_their_seats(server: LocalServer) -> None:
    asked = {"model": "chatter", "prompt": "x" * 8000, "max_tokens": MANY, "stream": True}
    body = json.dumps(asked).encode()
    silent = [_silent_stream(server, body, "/v1/completions") for _ in range(SEATS)]
    try:
        until(lambda: _running(server, "chatter") == SEATS)
        small = {**asked, "prompt": "hello", "max_tokens": 2}
        answer = httpx.post(
            f"http://{server.http_url}/v1/completions", json=small, timeout=PATIENCE_S
        )
        assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        until(lambda: _running(server, "chatter") == 0)
        for sock in silent:
            _read_until_closed(sock)
    finally:
        for sock in silent:
            sock.close()


def test_a_request_id_above_the_bound_is_refused(server: LocalServer) -> None:
    long_id = "i" * (MAX_ID_CHARS + 1)
    answer = httpx.post(_generate_url(server), json={"COUNT": 1, "id": long_id})
    assert answer.status_code == 400
    assert f"the request id is {MAX_ID_CHARS + 1} characters" in answer.json()["error"]
    assert f"above the limit of {MAX_ID_CHARS}" in answer.json()["error"]
    infer = f"http://{server.http_url}/v2/models/big/infer"
    tensor = {"name": "COUNT", "datatype": "INT32", "shape": [1], "data": [1]}
    refused = httpx.post(infer, json={"id": long_id, "inputs": [tensor]})
    assert refused.status_code == 400 and "above the limit" in refused.json()["error"]


# -- gRPC ---------------------------------------------------------------------------------------


def _request(model: str, count: int) -> pb.ModelInferRequest:
    contents = pb.InferTensorContents(int_contents=[count])
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="COUNT", datatype="INT32", shape=[1], contents=contents
    )
    return pb.ModelInferRequest(model_name=model, inputs=[tensor])


class _SilentStream:
    """A raw ModelStreamInfer call whose answers are not read until `answers` is called."""

    def __init__(self, server: LocalServer, requests: list[pb.ModelInferRequest]) -> None:
        # No BDP probing: the window stays small, as a client that reads nothing would keep it.
        options = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0)]
        self.channel = grpc.insecure_channel(server.grpc_url, options=options)
        call = self.channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        self.call: Any = call(iter(requests))

    def status(self) -> grpc.RpcError:
        """Read what came, to the status that ended the stream."""
        with pytest.raises(grpc.RpcError) as ended:
            for _ in self.call:
                pass
        self.channel.close()
        return ended.value


def _cut_for_not_reading(stream: _SilentStream) -> None:
    error: Any = stream.status()
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"did not read this stream's answers within {UNREAD_S:g} s" in error.details()


def _served(server: LocalServer) -> None:
    """Another client is answered meanwhile."""
    with tg.InferenceServerClient(server.grpc_url) as client:
        tensor = tg.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        answer = client.infer("big", [tensor], client_timeout=PATIENCE_S)
        assert answer.as_numpy("OUT").shape == (ANSWER_ELEMENTS,)


def test_grpc_streams_left_unread_are_cut_and_free_their_seats(server: LocalServer) -> None:
    silent = [_SilentStream(server, [_request("gush", MANY)]) for _ in range(SEATS)]
    until(lambda: _running(server) == SEATS)
    _served(server)
    until(lambda: _running(server) == 0)
    for stream in silent:
        _cut_for_not_reading(stream)


def _outboxes(server: LocalServer) -> set[Outbox]:
    assert server.grpc.servicer is not None
    return server.grpc.servicer.outboxes


def _answered(server: LocalServer) -> int:
    return server.dataplane.manager.get("big").stats.success.count


def test_the_answers_an_unread_grpc_stream_holds_are_bounded(server: LocalServer) -> None:
    """Request after request of 16 KiB answers on one stream that is not read: the server holds
    at most max_stream_answers queued (and one more in the hands of each request in flight),
    reads the stream no further, serves others, then cuts it."""
    before = set(_outboxes(server))
    answered = _answered(server)
    stream = _SilentStream(server, [_request("big", 1) for _ in range(SENT)])
    until(lambda: len(_outboxes(server) - before) == 1)
    (outbox,) = _outboxes(server) - before
    until(lambda: outbox.queued == MAX_ANSWERS)  # full: the client reads nothing
    time.sleep(0.3)  # time for requests past the bounds to be read and answered, were they
    # Those answered: the ones gRPC took (the client's window), the queued, the ones in hand.
    assert _answered(server) - answered < SENT // 4
    _served(server)
    assert outbox.queued <= MAX_ANSWERS
    assert outbox.most_held <= MAX_ANSWERS + MAX_REQUESTS
    until(lambda: outbox not in _outboxes(server))  # cut, still unread
    assert outbox.most_held <= MAX_ANSWERS + MAX_REQUESTS
    _cut_for_not_reading(stream)


def test_a_grpc_request_id_above_the_bound_gets_its_error_in_stream(server: LocalServer) -> None:
    results: list[Any] = []
    with tg.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.append(error))
        tensor = tg.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        client.async_stream_infer("big", [tensor], request_id="i" * (MAX_ID_CHARS + 1))
        until(lambda: bool(results))
        client.stop_stream()
    assert results[0] is not None and "above the limit of" in str(results[0])
