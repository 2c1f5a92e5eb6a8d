"""`--api-key` over every route that generates or controls (issue 33), with real clients.

The attack: a server started with `--api-key` answered OIP infer/generate/generate_stream, gRPC
ModelInfer/ModelStreamInfer and RepositoryModelLoad, and the metrics port, to callers without
the key. Each test calls a route without the key, with a wrong one and with the right one;
health and readiness stay open for orchestrators' probes. REST worker processes apply the same
rule (tests/integration/openai/test_openai_access.py).
"""

from __future__ import annotations

import contextlib
import queue
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.generative import write_colours
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

from dlscale.errors import ConfigError, Unauthenticated
from dlscale.frontends.api_key import ApiKey
from dlscale.server_settings import Security

KEY = "sk-issue-33"
BEARER = {"authorization": f"Bearer {KEY}"}
WRONG = {"authorization": "Bearer sk-guessed"}
#: What a 401 says: the key was missing, or it was there and wrong.
MISSING, MISMATCH = "no Authorization header was sent", "is not this server's key"
ECHO = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
#: Every REST route the key guards: method, path, body.
GUARDED = [
    ("POST", "/v2/models/echo/infer", {"inputs": [{"name": "x", "shape": [1, 2],
                                                   "datatype": "FP32", "data": [1, 2]}]}),
    ("POST", "/v2/models/colours/generate", {"text_input": "w", "max_tokens": 2}),
    ("POST", "/v2/models/colours/generate_stream", {"text_input": "w", "max_tokens": 2}),
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/echo/load", {}),
    ("GET", "/v2/models/echo", None),
    ("GET", "/v2/models/echo/config", None),
    ("GET", "/v2/models/echo/stats", None),
    ("GET", "/v2", None),
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": "colours", "prompt": "w", "max_tokens": 2}),
    ("POST", "/v1/models/echo:predict", {"instances": [[1, 2]]}),  # TensorFlow Serving's
    ("GET", "/v1/models/echo/metadata", None),
]  # fmt: skip
#: TensorFlow Serving's model status is a readiness probe too (docs/tfserving.md).
OPEN = ["/v2/health/live", "/v2/health/ready", "/v2/models/echo/ready", "/v1/models/echo"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("keyed")
    write_null_model(root, "echo", ECHO)
    write_colours(root)
    with serving(root, api_key=KEY, metrics_port=0) as running:
        yield running


def _call(
    server: LocalServer, method: str, path: str, body: object, **headers: str
) -> httpx.Response:
    url = f"http://{server.http_url}{path}"
    return httpx.request(method, url, json=body, headers=headers, timeout=60)


def _said(response: httpx.Response) -> str:
    doc = response.json()
    error = doc["error"]
    return str(error["message"] if isinstance(error, dict) else error)  # OpenAI's shape or OIP's


@pytest.mark.parametrize(
    ("method", "path", "body"), GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED]
)
def test_every_rest_route_needs_the_key(
    server: LocalServer, method: str, path: str, body: object
) -> None:
    missing = _call(server, method, path, body)
    assert missing.status_code == 401 and MISSING in _said(missing)
    wrong = _call(server, method, path, body, **WRONG)
    assert wrong.status_code == 401 and MISMATCH in _said(wrong)
    assert _call(server, method, path, body, **BEARER).status_code == 200


@pytest.mark.parametrize("path", OPEN)
def test_health_and_readiness_stay_open(server: LocalServer, path: str) -> None:
    assert httpx.get(f"http://{server.http_url}{path}").status_code == 200


def test_a_body_without_the_key_is_not_waited_for(server: LocalServer) -> None:
    """A head that declares a large body is answered 401 at once, before any body arrives."""
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n"
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 401")


def test_tritonclient_http_sends_the_key_as_a_header(server: LocalServer) -> None:
    client = th.InferenceServerClient(server.http_url)
    x = th.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    try:
        with pytest.raises(InferenceServerException, match=MISSING) as caught:
            client.infer("echo", [x])
        assert caught.value.status() == "401"
        with pytest.raises(InferenceServerException, match=MISMATCH):
            client.load_model("echo", headers=dict(WRONG))  # tritonclient adds to its headers
        assert client.infer("echo", [x], headers=dict(BEARER)).as_numpy("y").shape == (1, 2)
        assert client.is_server_ready()
    finally:
        client.close()


def _grpc_input() -> tg.InferInput:
    x = tg.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    return x


def test_grpc_calls_need_the_key_as_metadata(server: LocalServer) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready()  # probes stay open
        assert client.is_model_ready("echo")
        for headers, said in ((None, MISSING), (WRONG, MISMATCH)):
            for call, args in (
                (client.infer, ("echo", [_grpc_input()])),
                (client.load_model, ("echo",)),
                (client.get_model_metadata, ("echo",)),
            ):
                with pytest.raises(InferenceServerException, match=said) as caught:
                    call(*args, headers=headers)  # type: ignore[operator]
                assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.infer("echo", [_grpc_input()], headers=BEARER).as_numpy("y").shape == (1, 2)
        client.load_model("echo", headers=BEARER)
    finally:
        client.close()


def _stream_once(url: str, headers: dict[str, str] | None) -> object:
    """The first thing one ModelStreamInfer stream answers: a result or an error."""
    client = tg.InferenceServerClient(url)
    answers: queue.Queue[object] = queue.Queue()
    try:
        client.start_stream(lambda result, error: answers.put(error or result), headers=headers)
        # A refused stream may have ended before this request is sent: its error is in the
        # callback's queue either way.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("echo", [_grpc_input()])
        return answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()


def test_grpc_streams_need_the_key(server: LocalServer) -> None:
    for headers, said in ((None, MISSING), (WRONG, MISMATCH)):
        refused = _stream_once(server.grpc_url, headers)
        assert isinstance(refused, InferenceServerException) and said in refused.message()
        assert refused.status() == "StatusCode.UNAUTHENTICATED"
    answered = _stream_once(server.grpc_url, BEARER)
    assert isinstance(answered, tg.InferResult) and answered.as_numpy("y").shape == (1, 2)


def test_the_openai_client_with_a_wrong_key_is_told_so(server: LocalServer) -> None:
    url = f"http://{server.http_url}/v1"
    wrong = openai.OpenAI(base_url=url, api_key="sk-guessed", max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError, match=MISMATCH):
        wrong.completions.create(model="colours", prompt="w", max_tokens=2)
    with openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) as client:
        assert client.completions.create(model="colours", prompt="w", max_tokens=2).choices


def test_the_metrics_port_needs_the_key(server: LocalServer) -> None:
    url = f"http://127.0.0.1:{server.server.ports['metrics']}/metrics"
    missing = httpx.get(url)
    assert missing.status_code == 401 and MISSING in missing.text
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.get(url, headers=WRONG)
    assert wrong.status_code == 401 and MISMATCH in wrong.text
    assert "nv_inference_request_success" in httpx.get(url, headers=BEARER).text


def test_scope_openai_guards_the_openai_routes_only(tmp_path: Path) -> None:
    write_null_model(tmp_path, "echo", ECHO)
    with serving(tmp_path, api_key=KEY, api_key_scope="openai") as server:
        body = GUARDED[0][2]
        assert _call(server, "POST", "/v2/models/echo/infer", body).status_code == 200
        assert _call(server, "GET", "/v1/models", None).status_code == 401
        assert _call(server, "GET", "/v2/logging", None).status_code == 401
        assert _call(server, "GET", "/v1/models", None, **BEARER).status_code == 200


def test_a_key_is_not_empty_and_its_scope_is_known() -> None:
    with pytest.raises(ConfigError, match="cannot be empty"):
        Security(api_key="")
    with pytest.raises(ConfigError, match="scope"):
        Security(api_key=KEY, api_key_scope="everything")
    assert Security(api_key=KEY).key == ApiKey(KEY, "all")
    assert not ApiKey(KEY).guards("health") and ApiKey(KEY).guards("metrics")
    with pytest.raises(Unauthenticated, match="must be 'Bearer <key>'"):
        ApiKey(KEY).check({"authorization": f"Basic {KEY}"})
