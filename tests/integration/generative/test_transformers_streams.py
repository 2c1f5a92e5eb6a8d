"""The zoo's llama-tiny on the real transformers engine, streamed: REST generate_stream (httpx)
and gRPC ModelStreamInfer (tritonclient) give, token by token, the text the joined answer gives;
a client that disconnects mid-stream frees the engine's sequence; the token metrics count."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("transformers")

import tritonclient.grpc as tg
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.slow import slow_only

from dlscale.models.zoo import build_zoo

MODEL = "llama-tiny"
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
PATIENCE_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("llm_streams")
    build_zoo(root, [MODEL])
    with serving(root, metrics_port=0) as running:
        yield running


def _url(server: LocalServer, route: str) -> str:
    return f"http://{server.http_url}/v2/models/{MODEL}/{route}"


def _grpc_tokens(server: LocalServer, prompt: str) -> list[Any]:
    client = tg.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = tg.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    client.async_stream_infer(MODEL, [text], parameters=GREEDY)
    got = []
    while True:
        result, error = results.get(timeout=PATIENCE_S)
        assert error is None, error
        got.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return got


@pytest.mark.slow
@slow_only("20 s to build llama-tiny and start its engine for streams")
def test_streams_over_rest_and_grpc_agree_with_the_joined_answer(server: LocalServer) -> None:
    prompt = "the cat sat on"
    body = {"text_input": prompt, "parameters": GREEDY}
    joined = httpx.post(_url(server, "generate"), json=body, timeout=PATIENCE_S).json()
    assert joined["num_output_tokens"] == 12 and joined["finish_reason"] == "length"

    with httpx.stream("POST", _url(server, "generate_stream"), json=body, timeout=PATIENCE_S) as r:
        events = [json.loads(x[5:]) for x in r.iter_lines() if x.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == joined["text_output"]
    assert events[-1]["num_output_tokens"] == 12 and len(events) > 1

    tokens = _grpc_tokens(server, prompt)
    text = b"".join(t.as_numpy("text_output")[0] for t in tokens).decode()
    assert text == joined["text_output"]

    # A client that leaves mid-stream: the engine's sequence is freed, its seat given back.
    long = {"text_input": prompt, "parameters": {**GREEDY, "max_tokens": 500}}
    with httpx.stream("POST", _url(server, "generate_stream"), json=long, timeout=PATIENCE_S) as r:
        lines = r.iter_lines()
        next(x for x in lines if x.startswith("data:"))
    seats = server.dataplane.manager.get(MODEL).runner.seats
    assert seats is not None
    deadline = time.monotonic() + PATIENCE_S
    while (
        seats.running
        or server.dataplane.manager.get(MODEL).instances[0].backend.engine_stats().running
    ):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the engine never freed the sequence"
        time.sleep(0.05)

    metrics = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics").text
    assert f'dlscale_generation_tokens_total{{model="{MODEL}",version="1"}}' in metrics
    assert "dlscale_kv_cache_usage_ratio" in metrics
