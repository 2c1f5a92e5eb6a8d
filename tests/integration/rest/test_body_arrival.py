"""A request body read the same however it arrives (issue 39, the connection's third pass).

A body that comes whole with its head is kept as the parser gave it; one still missing bytes
once its head is read gets a buffer of its declared length, which the socket fills in place.
Each test sends the same binary inference request over a raw socket in a different cut, on one
keep-alive connection answered by the connection's one task, and checks every answer.
"""

from __future__ import annotations

import json
import time

import numpy as np
from tests.toolkit.clients import RawHttp
from tests.toolkit.server import LocalServer

#: Long enough for the server to read what was sent before the rest comes (not a timing claim:
#: the answers are the same if the kernel joins the pieces).
_GAP_S = 0.05


def _request(values: np.ndarray) -> tuple[bytes, bytes]:
    """The head and the body of a binary infer request for `identity` ([1, 16] FP32)."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, 16],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + values.tobytes()
    head = (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\nInference-Header-Content-Length: %d\r\n\r\n"
        % (len(body), len(header))
    )
    return head, body


def _answered(conn: RawHttp) -> np.ndarray:
    status, headers, body = conn.response()
    assert status == 200, body
    json_end = int(headers["inference-header-content-length"])
    return np.frombuffer(body[json_end:], np.float32).reshape(1, 16)


def _values(seed: int) -> np.ndarray:
    return np.arange(16, dtype=np.float32).reshape(1, 16) + seed


def test_a_body_whole_with_its_head_after_it_or_in_pieces_is_read_the_same(
    server: LocalServer,
) -> None:
    with RawHttp(server.http.port) as conn:
        values = _values(1)
        head, body = _request(values)
        conn.send(head + body)  # whole with its head
        assert np.array_equal(_answered(conn), values)

        values = _values(2)
        head, body = _request(values)
        conn.send(head)  # the head alone, then the body: read into its own buffer
        time.sleep(_GAP_S)
        conn.send(body)
        assert np.array_equal(_answered(conn), values)

        values = _values(3)
        head, body = _request(values)
        for start in range(0, len(body) + 1, 37):  # part with the head, the rest in pieces
            conn.send((head if start == 0 else b"") + body[start : start + 37])
            time.sleep(_GAP_S / 5)
        assert np.array_equal(_answered(conn), values)


def test_pipelined_requests_with_a_body_cut_between_reads_are_answered_in_order(
    server: LocalServer,
) -> None:
    with RawHttp(server.http.port) as conn:
        sent = [_values(10 + i) for i in range(3)]
        wire = b"".join(head + body for head, body in map(_request, sent))
        cut = len(wire) - 50  # the last body is missing its end when the first read is parsed
        conn.send(wire[:cut])
        time.sleep(_GAP_S)
        conn.send(wire[cut:])
        for values in sent:
            assert np.array_equal(_answered(conn), values)
        # The connection is still served after them (its task waits for the next request).
        values = _values(20)
        conn.send(b"".join(_request(values)))
        assert np.array_equal(_answered(conn), values)
