"""Large tensors over REST and gRPC: where the payload is copied between socket and backend.

A null model echoes its input (the same array), so everything between the socket and the backend
is the transport's and the codec's. The buffer trace (dlscale.wire.tracing) records the memory
each stage holds; bytes of a later stage inside an earlier stage's memory were not copied. A
join, a `bytes()` or a `tobytes()` added anywhere on the path makes these tests fail.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import LocalServer, serving

from dlscale.frontends.rest.body import HEAD_READ
from dlscale.types import InferenceRequest
from dlscale.wire import tracing
from dlscale.wire.rest import encode_request

IMAGES = BATCHED.format(max_batch=8, delay=0) + NULL_TENSORS.format(
    inp="input", out="output", width="3, 224, 224", out_width="3, 224, 224"
)
ROWS = 8
PAYLOAD = ROWS * 3 * 224 * 224 * 4  # 4.8 MB in each direction


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("large")
    write_null_model(root, "echo", IMAGES)
    with serving(root, max_body_bytes=64 * 2**20) as running:
        yield running


def _images(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS, 3, 224, 224)).astype(np.float32)


def test_rest_payload_is_never_copied_between_socket_and_backend(server: LocalServer) -> None:
    x = _images()
    client = th.InferenceServerClient(server.http_url)
    given = th.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=True)
    wanted = th.InferRequestedOutput("output", binary_data=True)
    with tracing.traced() as trace:
        answer = client.infer("echo", [given], outputs=[wanted])
    client.close()
    np.testing.assert_array_equal(answer.as_numpy("output"), x)
    assert trace.bytes_of(tracing.BACKEND_IN) == PAYLOAD
    # Socket to backend: all but what arrived with the head was read in place by the socket.
    assert trace.inside(tracing.BACKEND_IN, tracing.SOCKET_IN) >= PAYLOAD - HEAD_READ
    # Backend to socket: the answer's tensor is written from the backend's own memory, and
    # with an echo that is the very memory the socket wrote the request into.
    assert PAYLOAD < trace.bytes_of(tracing.SOCKET_OUT) < PAYLOAD + 1024  # and the heads
    assert trace.inside(tracing.SOCKET_OUT, tracing.BACKEND_OUT) == PAYLOAD
    assert trace.inside(tracing.SOCKET_OUT, tracing.SOCKET_IN) >= PAYLOAD - HEAD_READ


def test_grpc_payload_is_read_in_place_and_joined_once(server: LocalServer) -> None:
    x = _images(1)
    client = tg.InferenceServerClient(server.grpc_url)
    given = tg.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    with tracing.traced() as trace:
        answer = client.infer("echo", [given])
    client.close()
    np.testing.assert_array_equal(answer.as_numpy("output"), x)
    # Socket to backend: the inputs are views of the bytes gRPC handed over (its own copy).
    assert trace.bytes_of(tracing.BACKEND_IN) == PAYLOAD
    assert trace.inside(tracing.BACKEND_IN, tracing.SOCKET_IN) == PAYLOAD
    # Backend to socket: one copy, the join into the bytes gRPC takes (a few header bytes more).
    sent = trace.of(tracing.SOCKET_OUT)
    assert len(sent) == 1 and PAYLOAD < sent[0].size < PAYLOAD + 1024
    assert trace.inside(tracing.SOCKET_OUT, tracing.BACKEND_OUT) == 0


def test_grpc_stream_answers_large_tensors(server: LocalServer) -> None:
    x = _images(2)
    answers: list[object] = []
    client = tg.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    given = tg.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    for n in range(3):
        client.async_stream_infer("echo", [given], request_id=str(n))
    client.stop_stream()
    client.close()
    assert len(answers) == 3
    for result in answers:
        assert isinstance(result, tg.InferResult)
        np.testing.assert_array_equal(result.as_numpy("output"), x)


def _http_request(port: int, x: np.ndarray, request_id: str) -> bytes:
    encoded = encode_request(InferenceRequest("echo", {"input": x}, id=request_id), True)
    body = b"".join(bytes(p) for p in encoded.parts)
    head = (
        f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {encoded.header_length}\r\n\r\n"
    )
    return head.encode() + body


def _read_answer(reader: object) -> tuple[int, bytes]:
    status = int(reader.readline().split()[1])  # type: ignore[attr-defined]
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):  # type: ignore[attr-defined]
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, reader.read(length)  # type: ignore[attr-defined]


def test_large_bodies_pipelined_and_in_pieces(server: LocalServer) -> None:
    """Bodies read in place leave the connection ready for what follows them, however the
    bytes are cut: pipelined behind each other, or trickled in odd pieces."""
    port = int(server.http_url.rsplit(":", 1)[1])
    images = [_images(10 + n) for n in range(3)]
    wire = b"".join(_http_request(port, x, str(n)) for n, x in enumerate(images))
    wire += b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        sock.sendall(wire)
        answers = [_read_answer(reader) for _ in range(4)]
        cut = 1_000_003  # pieces that never line up with a head or a body
        piece = _http_request(port, images[0], "again")
        for start in range(0, len(piece), cut):
            sock.sendall(piece[start : start + cut])
        answers.append(_read_answer(reader))
    assert [status for status, _ in answers] == [200] * 5
    for n, x in enumerate([*images, None, images[0]]):
        if x is None:
            continue
        _, body = answers[n]
        assert body.endswith(x.tobytes())


def test_body_buffers_are_reused_once_released(tmp_path: Path) -> None:
    from dlscale.frontends.rest.body import POOLED_FROM, BodyBuffers

    pool = BodyBuffers()
    first = pool.take(POOLED_FROM * 4)
    held = np.frombuffer(memoryview(first)[:16], np.uint8)  # a view keeps the buffer busy
    second = pool.take(POOLED_FROM * 4)
    assert not np.shares_memory(first, second)
    address = first.__array_interface__["data"][0]
    del first, held
    third = pool.take(POOLED_FROM * 4 - 100)
    assert third.__array_interface__["data"][0] == address  # the released buffer came back
    assert pool.held_bytes == 2 * (1 << 20)
    del second, third
    pool.close()
    assert pool.held_bytes == 0
