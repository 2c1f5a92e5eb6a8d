"""A vLLM engine and classic models under [qos] on one CPU (make test-vllm): the engine steps
only while it holds a lease of the device's slot, granted by the same scheduler as the classic
models' batches (serving/qos/leases.py).

The zoo's llama-tiny on the real vLLM engine (no [qos] of its own: a best-effort tenant) shares
the cpu with two null models that have [qos]: `protected` (2 ms a request) and `hog` (a batch
of HOG_S seconds). The tests count what the device scheduler granted (its metrics, scraped as a
user would) and the order of events that the leases impose; how long anything took is not
asserted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tomli_w

pytest.importorskip("vllm", reason="the vLLM backend needs the [vllm] extra: make test-vllm")
tritonclient_http = pytest.importorskip("tritonclient.http")

from tests.toolkit.models import write_null_model  # noqa: E402
from tests.toolkit.repositories import NULL_TENSORS  # noqa: E402
from tests.toolkit.server import LocalServer, serving  # noqa: E402

from dlscale.models.zoo.decoder import LLAMA_TINY  # noqa: E402
from dlscale.serving.metrics.collectors import DECISIONS  # noqa: E402

pytestmark = pytest.mark.vllm

ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25, "enforce_eager": True}
FLOOD = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}
STREAMS = 2  # the flood's clients, each one stream at a time
PROTECTED_COUNT = 20
HOG_S = 2.0  # the hog's one batch: the engine must make no token while it runs
PATIENCE_S = 180.0  # a safety net only
ROW = np.ones((1, 4), np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("vllm_qos")
    folder = LLAMA_TINY.build(root)
    config = {"name": folder.name, "backend": "vllm", "backend_options": ENGINE}
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    tensors = NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
    write_null_model(
        root,
        "protected",
        "max_batch_size = 1\n"
        + tensors
        + "[backend_options]\ndelay_us = 2000\n[qos]\nlatency_objective_us = 100000\n",
    )
    write_null_model(
        root,
        "hog",
        "max_batch_size = 1\n"
        + tensors
        + f"[backend_options]\ndelay_us = {int(HOG_S * 1e6)}\n[qos]\n",
    )
    with serving(root, metrics_port=0) as running:
        yield running


def _granted(server: LocalServer, model: str) -> float:
    """Slots the cpu's scheduler granted `model` (batches, or an engine's leases): its metrics."""
    port = server.server.ports["metrics"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).text
    total, prefix = 0.0, "dlscale_qos_batches_total{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'model="{model}"' in line and 'device="cpu"' in line:
            decision = line.split('decision="')[1].split('"')[0]
            assert decision in DECISIONS
            total += float(line.rsplit(" ", 1)[1])
    return total


def _stream(client: httpx.Client, server: LocalServer, first: list[float] | None = None) -> int:
    """One generation streamed over REST; its last token count (`first`: when its first
    token came, perf_counter)."""
    url = f"http://{server.http_url}/v2/models/{LLAMA_TINY.name}/generate_stream"
    body = {"text_input": "the device is shared by", "parameters": FLOOD}
    tokens = 0
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            part = json.loads(line.removeprefix("data:"))
            count = int(part.get("num_output_tokens", 0))
            if count and first is not None and not first:
                first.append(time.perf_counter())
            tokens = max(tokens, count)
    return tokens


def _flood(server: LocalServer, stop: threading.Event, streamed: list[int]) -> None:
    """One client streaming generations back to back until `stop`; each one's token count."""
    with httpx.Client(timeout=PATIENCE_S) as client:
        while not stop.is_set():
            streamed.append(_stream(client, server))


def _infer(server: LocalServer, model: str) -> None:
    client = tritonclient_http.InferenceServerClient(server.http_url, network_timeout=PATIENCE_S)
    inputs = [tritonclient_http.InferInput("x", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(ROW)
    try:
        assert client.infer(model, inputs).as_numpy("y").shape == (1, 4)
    finally:
        client.close()


def test_a_flood_of_vllm_streams_leaves_the_protected_model_its_slots(
    server: LocalServer,
) -> None:
    stop, streamed = threading.Event(), list[int]()
    floods = [
        threading.Thread(target=_flood, args=(server, stop, streamed), daemon=True)
        for _ in range(STREAMS)
    ]
    for thread in floods:
        thread.start()
    try:
        for _ in range(int(PATIENCE_S / 0.05)):  # until the flood's first stream is answered
            if streamed:
                break
            stop.wait(0.05)
        leases_before = _granted(server, LLAMA_TINY.name)
        assert leases_before > 0  # the engine's steps ran under leases of the cpu's slot
        protected_before = _granted(server, "protected")
        for _ in range(PROTECTED_COUNT):
            _infer(server, "protected")  # every one answered beside the flood
        leases_during = _granted(server, LLAMA_TINY.name) - leases_before
        protected_during = _granted(server, "protected") - protected_before
    finally:
        stop.set()
        for thread in floods:
            thread.join(PATIENCE_S)
    # One grant per protected request while the engine kept being leased the device: one
    # scheduler interleaved both kinds. Paused and resumed, every sequence ran to its end.
    assert protected_during == PROTECTED_COUNT
    assert leases_during > 0
    assert streamed and set(streamed) == {FLOOD["max_tokens"]}
    # No sequence is left: the engine gave its lease back, and the device is free.
    _infer(server, "protected")
    assert _granted(server, "protected") == protected_before + PROTECTED_COUNT + 1


def test_the_engine_makes_no_token_while_a_classic_batch_holds_the_device(
    server: LocalServer,
) -> None:
    hog_granted = _granted(server, "hog")
    sent = time.perf_counter()
    hog = threading.Thread(target=_infer, args=(server, "hog"), daemon=True)
    hog.start()
    for _ in range(int(PATIENCE_S / 0.01)):  # until the cpu's scheduler granted the hog's batch
        if _granted(server, "hog") > hog_granted:
            break
        time.sleep(0.01)
    assert hog.is_alive(), "the hog's batch ended before the stream could be sent"
    first: list[float] = []
    with httpx.Client(timeout=PATIENCE_S) as client:
        assert _stream(client, server, first) == FLOOD["max_tokens"]
    hog.join(PATIENCE_S)
    # The hog's batch started after `sent` and computes HOG_S: the engine, asked meanwhile,
    # waited paused for its lease until that batch gave the slot back.
    assert first[0] >= sent + HOG_S
