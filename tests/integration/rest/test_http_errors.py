"""Bad input over REST: each gets the right status and an error that says what was wrong."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.clients import RawHttp
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, max_body_bytes=LIMIT) as running:
        yield running


def _tensor(name: str, shape: list[int], datatype: str, data: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def _expect(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for fragment in fragments:
        assert fragment in error, error


IDENTITY = "/v2/models/identity/infer"
ROW = [float(i) for i in range(16)]


# -- malformed requests ----------------------------------------------------------------------------


def test_malformed_json(http: httpx.Client) -> None:
    _expect(http.post(IDENTITY, content=b'{"inputs": [}'), 400, "malformed JSON")
    _expect(http.post(IDENTITY, content=b""), 400, "body is empty")
    _expect(http.post(IDENTITY, json={"inputs": "x"}), 400, "invalid inference request", "inputs")
    bad_shape = {"inputs": [_tensor("input", [1, -16], "FP32", ROW)]}
    _expect(http.post(IDENTITY, json=bad_shape), 400, "shape")
    no_name = {"inputs": [{"shape": [1, 16], "datatype": "FP32", "data": ROW}]}
    _expect(http.post(IDENTITY, json=no_name), 400, "name")


def test_unknown_model_and_version(http: httpx.Client) -> None:
    body = {"inputs": [_tensor("input", [1, 16], "FP32", ROW)]}
    _expect(http.post("/v2/models/ghost/infer", json=body), 404, "unknown model 'ghost'")
    _expect(http.post("/v2/models/identity/versions/9/infer", json=body), 404, "no version '9'")
    _expect(http.get("/v2/models/ghost"), 404, "ghost")
    _expect(http.get("/v2/models/ghost/ready"), 404, "ghost")
    _expect(http.get("/v2/models/identity/versions/2/stats"), 404, "no version '2'")
    _expect(http.get("/v2/models/broken"), 503, "not ready", "max_batch_size")


def test_wrong_or_missing_inputs(http: httpx.Client) -> None:
    wrong = {"inputs": [_tensor("inputs", [1, 16], "FP32", ROW)]}
    _expect(http.post(IDENTITY, json=wrong), 400, "lacks ['input']")
    a = _tensor("a", [1, 4], "FP32", [1, 2, 3, 4])
    _expect(http.post("/v2/models/two_inputs/infer", json={"inputs": [a]}), 400, "lacks ['b']")
    b = _tensor("b", [1, 4], "INT32", [1, 2, 3, 4])
    extra = {"inputs": [a, b, _tensor("c", [1], "FP32", [0])]}
    _expect(http.post("/v2/models/two_inputs/infer", json=extra), 400, "unexpected inputs ['c']")
    twice = {"inputs": [a, a, b]}
    _expect(http.post("/v2/models/two_inputs/infer", json=twice), 400, "appears twice")
    unknown_out = {"inputs": [a, b], "outputs": [{"name": "nope"}]}
    _expect(http.post("/v2/models/two_inputs/infer", json=unknown_out), 400, "unknown outputs")


def test_wrong_datatype(http: httpx.Client) -> None:
    body = {"inputs": [_tensor("input", [1, 16], "INT32", list(range(16)))]}
    _expect(http.post(IDENTITY, json=body), 400, "datatype FP32", "gave INT32")
    body = {"inputs": [_tensor("input", [1, 16], "FLOAT", ROW)]}
    _expect(http.post(IDENTITY, json=body), 400, "unknown datatype 'FLOAT'")
    body = {"inputs": [_tensor("input", [1, 16], "FP32", ["x"] * 16)]}
    _expect(http.post(IDENTITY, json=body), 400, "must hold numbers", "strings")
    body = {"inputs": [_tensor("n", [1, 3], "INT64", [1, 2.5, 3])]}
    _expect(http.post("/v2/models/int64/infer", json=body), 400, "integers")
    body = {"inputs": [_tensor("text", [1, 2], "BYTES", ["a", 1])]}
    _expect(http.post("/v2/models/strings/infer", json=body), 400, "strings only")


def test_shape_and_data_length_mismatch(http: httpx.Client) -> None:
    body = {"inputs": [_tensor("input", [1, 15], "FP32", ROW[:15])]}
    _expect(http.post(IDENTITY, json=body), 400, "shape [-1, 16]", "gave [1, 15]")
    body = {"inputs": [_tensor("input", [1, 16], "FP32", ROW[:15])]}
    _expect(http.post(IDENTITY, json=body), 400, "16 elements", "holds 15")
    body = {"inputs": [_tensor("input", [2, 16], "FP32", [ROW, ROW[:15]])]}
    _expect(http.post(IDENTITY, json=body), 400, "ragged")
    body = {
        "inputs": [_tensor("x", [3, 2], "FP32", [0] * 6), _tensor("flags", [3], "BOOL", [1] * 3)]
    }
    _expect(http.post("/v2/models/fixed/infer", json=body), 400, "true/false")


def test_batch_above_max_batch_size(http: httpx.Client) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0]] * 9
    body = {"inputs": [_tensor("input", [9, 4], "FP32", rows)]}
    _expect(http.post("/v2/models/plus/infer", json=body), 400, "exceeds max_batch_size 8")


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_in_json_is_refused(http: httpx.Client, datatype: str) -> None:
    body = {"inputs": [_tensor("x", [1, 4], datatype, [1.0, 2.0, 3.0, 4.0])]}
    _expect(http.post("/v2/models/half/infer", json=body), 400, datatype, "binary data")


def test_bad_parameters(http: httpx.Client) -> None:
    body = {"inputs": [_tensor("input", [1, 16], "FP32", ROW)], "parameters": {"priority": "high"}}
    _expect(http.post(IDENTITY, json=body), 400, "'priority' must be a non-negative integer")
    # The DataPlane's message, word for word what gRPC answers (test_grpc_errors.py).
    same = "parameter 'priority' must be a non-negative integer, got 'high'"
    assert http.post(IDENTITY, json=body).json()["error"] == same
    body["parameters"] = {"timeout": -5}
    _expect(http.post(IDENTITY, json=body), 400, "'timeout'")
    body["parameters"] = {"binary_data_output": "yes"}
    _expect(http.post(IDENTITY, json=body), 400, "binary_data_output")


# -- binary data that does not add up --------------------------------------------------------------


def _binary_request(
    http: httpx.Client, header: dict[str, Any], tail: bytes, header_length: int | None = None
) -> httpx.Response:
    head = json.dumps(header).encode()
    length = len(head) if header_length is None else header_length
    return http.post(
        IDENTITY, content=head + tail, headers={"Inference-Header-Content-Length": str(length)}
    )


def _binary_input(size: int) -> dict[str, Any]:
    tensor = _tensor("input", [1, 16], "FP32", None)
    del tensor["data"]
    tensor["parameters"] = {"binary_data_size": size}
    return {"inputs": [tensor]}


def test_binary_sizes_that_do_not_add_up(http: httpx.Client) -> None:
    data = np.zeros(16, dtype=np.float32).tobytes()
    _expect(_binary_request(http, _binary_input(64), data[:40]), 400, "only 40 bytes")
    _expect(_binary_request(http, _binary_input(64), data + b"xx"), 400, "2 bytes after")
    _expect(_binary_request(http, _binary_input(60), data[:60]), 400, "takes 64 bytes", "60")
    _expect(_binary_request(http, _binary_input(64), data, 10_000), 400, "only")
    _expect(_binary_request(http, _binary_input(-1), data), 400, "binary_data_size")
    no_header = http.post(IDENTITY, content=json.dumps(_binary_input(64)).encode() + data)
    _expect(no_header, 400, "malformed JSON")
    header_only = http.post(IDENTITY, json=_binary_input(64))
    _expect(header_only, 400, "no Inference-Header-Content-Length")
    bad = http.post(IDENTITY, content=data, headers={"Inference-Header-Content-Length": "x"})
    _expect(bad, 400, "Inference-Header-Content-Length must be")


def test_bytes_binary_that_does_not_add_up(http: httpx.Client) -> None:
    good = th.InferInput("text", [1, 2], "BYTES")
    good.set_data_from_numpy(np.array([[b"ab", b"c"]], dtype=object))
    raw = good._get_binary_data()
    tensor = {"name": "text", "shape": [1, 2], "datatype": "BYTES"}
    for payload, fragment in ((raw[:-1], "claims 1 bytes"), (raw[:6], "holds 1")):
        tensor["parameters"] = {"binary_data_size": len(payload)}
        head = json.dumps({"inputs": [tensor]}).encode()
        r = http.post(
            "/v2/models/strings/infer",
            content=head + payload,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
        _expect(r, 400, fragment)


def test_raw_binary_form_errors(http: httpx.Client) -> None:
    raw = {"Inference-Header-Content-Length": "0"}
    r = http.post(IDENTITY, content=b"\0" * 60, headers=raw)
    _expect(r, 400, "takes 64 bytes")
    r = http.post("/v2/models/two_inputs/infer", content=b"\0" * 32, headers=raw)
    _expect(r, 400, "one input", "['a', 'b']")


def test_compression_errors(http: httpx.Client) -> None:
    r = http.post(IDENTITY, content=b"not gzip", headers={"Content-Encoding": "gzip"})
    _expect(r, 400, "cannot be decompressed")
    r = http.post(IDENTITY, content=b"x", headers={"Content-Encoding": "br"})
    _expect(r, 415, "Content-Encoding 'br'")  # RFC 9110: unsupported coding


def test_errors_through_tritonclient(server: LocalServer) -> None:
    client = th.InferenceServerClient(server.http_url)
    x = th.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="unknown model 'ghost'") as caught:
        client.infer("ghost", [x])
    assert caught.value.status() == "404"
    y = th.InferInput("input", [1, 16], "FP64")
    y.set_data_from_numpy(np.zeros((1, 16), dtype=np.float64))
    with pytest.raises(InferenceServerException, match="request gave FP64") as caught:
        client.infer("identity", [y])
    assert caught.value.status() == "400"
    client.close()


# -- routes and methods ----------------------------------------------------------------------------


def test_unknown_route_and_wrong_method(http: httpx.Client) -> None:
    _expect(http.get("/v9/models"), 404, "no route")  # /v1 is the OpenAI API (docs/openai.md)
    _expect(http.get("/v2/models/identity/versions/1/explain"), 404, "no route")
    _expect(http.get("/v2/health"), 404, "no route")
    r = http.get(IDENTITY)
    _expect(r, 405, "GET is not allowed", "use POST")
    assert r.headers["allow"] == "POST"
    _expect(http.post("/v2/health/live"), 405, "use GET")
    _expect(http.delete("/v2/repository/models/identity/load"), 405, "use POST")
    head = http.head("/v2/health/live")  # answered without a body; the connection stays usable
    assert (head.status_code, head.content) == (405, b"")
    assert http.get("/v2/health/live").status_code == 200


def test_repository_errors(http: httpx.Client) -> None:
    _expect(http.post("/v2/repository/models/ghost/load"), 404, "no model 'ghost'")
    load = "/v2/repository/models/identity/load"
    for params, fragment in [
        ({"config": "{not json"}, "not a valid Triton model configuration"),
        ({"config": '{"inputs": []}'}, 'no field named "inputs"'),
        ({"config": 3}, "'config' must be a string"),
        ({"confg": "{}"}, "unknown load parameters ['confg']"),
        ({"file:1/model.onnx": "AAAA"}, "needs the 'config' parameter too"),
        ({"config": "{}", "file:1/model.onnx": "@@"}, "is not valid base64"),
        ({"config": "{}", "file:../model.onnx": "AAAA"}, "expected 'file:<version>/<file name>'"),
        ({"config": '{"platform": "tensorrt_plan"}'}, "'tensorrt_plan' is not a runtime"),
    ]:
        _expect(http.post(load, json={"parameters": params}), 400, fragment)
    _expect(http.post(load, json={"parameters": []}), 400, "'parameters'")
    _expect(http.post("/v2/repository/index", content=b"[1"), 400, "malformed JSON")
    _expect(http.post("/v2/repository/index", json={"ready": "yes"}), 400, "'ready'")
    _expect(http.post("/v2/repository/models/ghost/unload"), 404, "ghost")


# -- body limit and HTTP framing, over raw sockets -------------------------------------------------


def _raw(server: LocalServer) -> RawHttp:
    return RawHttp(server.http.port)


def test_body_above_limit_refused_before_it_is_read(server: LocalServer) -> None:
    with _raw(server) as sock:
        # Only the head is sent: the answer must come without the server waiting for the body.
        sock.send(
            f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
        )
        status, headers, body = sock.response()
    assert status == 413
    assert headers["connection"] == "close"
    assert f"exceeds the limit of {LIMIT} bytes" in json.loads(body)["error"]


def test_chunked_body_above_limit(server: LocalServer) -> None:
    chunk = b"x" * 65536
    with _raw(server) as sock:
        sock.send(
            f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        for _ in range(LIMIT // len(chunk) + 1):
            sock.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, body = sock.response()
    assert status == 413
    assert "exceeds the limit" in json.loads(body)["error"]


def test_large_body_through_httpx_gets_413(http: httpx.Client) -> None:
    r = http.post(IDENTITY, content=b"0" * (LIMIT + 10))
    _expect(r, 413, "exceeds the limit")


def test_malformed_http(server: LocalServer) -> None:
    with _raw(server) as sock:
        sock.send(b"GARBAGE\r\n\r\n")
        status, _, body = sock.response()
    assert status == 400
    assert "malformed HTTP request" in json.loads(body)["error"]


def test_pipelined_requests_answered_in_order(server: LocalServer) -> None:
    bodies = []
    for value in range(3):
        doc = {"id": str(value), "inputs": [_tensor("input", [1, 16], "FP32", [value] * 16)]}
        bodies.append(json.dumps(doc).encode())
    wire = b"".join(
        f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b
        for b in bodies
    )
    wire += b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with _raw(server) as sock:
        sock.send(wire)
        answers = [sock.response() for _ in range(4)]
    for value, (status, _, body) in enumerate(answers[:3]):
        doc = json.loads(body)
        assert status == 200
        assert doc["id"] == str(value)
        assert doc["outputs"][0]["data"] == [float(value)] * 16
    assert answers[3][0] == 200


def test_expect_continue_and_http10(server: LocalServer) -> None:
    body = json.dumps({"inputs": [_tensor("input", [1, 16], "FP32", ROW)]}).encode()
    with _raw(server) as sock:
        sock.send(
            f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        status, _, _ = sock.response()
        assert status == 100
        sock.send(body)
        status, _, answer = sock.response()
        assert status == 200
        assert json.loads(answer)["outputs"][0]["data"] == ROW
    with _raw(server) as sock:
        sock.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        status, headers, _ = sock.response()
        assert status == 200
        assert headers["connection"] == "close"
        assert sock.closed_by_server()  # closed after the answer


def test_readiness_says_which_model_failed_and_why_and_polls_are_not_failures(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    # It used to say "loading models or shutting down" when a model had failed to load.
    _expect(http.get("/v2/health/ready"), 503, "model 'broken' is UNAVAILABLE", "max_batch_size")
    with caplog.at_level(logging.INFO, logger="dlscale.requests"):
        for _ in range(3):  # a load balancer's readiness probe of a model that is not ready
            _expect(http.get("/v2/models/broken/ready"), 503, "not ready", "max_batch_size")
    assert "request failed" not in caplog.text
