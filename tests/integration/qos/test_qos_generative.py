"""A generative engine and a classic model under [qos] on one CPU: the engine's steps take the
device's slots from the same pool as the classic model's batches (serving/qos/steps.py).

The zoo's llama-tiny on the real transformers engine is flooded with streams over REST while
the protected null model is asked over tritonclient. The test counts what the device scheduler
granted (its metrics, scraped as a user would); how long anything took is not asserted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

pytest.importorskip("transformers")

import tritonclient.http as httpclient
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS
from tests.toolkit.server import LocalServer, serving

from dlscale.models.zoo import build_zoo
from dlscale.serving.metrics.collectors import DECISIONS

ENGINE = "llama-tiny"
FLOOD = {"temperature": 0.0, "max_tokens": 48, "ignore_eos": True}
STREAMS = 4  # the flood's clients, each one stream at a time
PROTECTED_COUNT = 30
PATIENCE_S = 120.0  # a safety net only
ROW = np.ones((1, 4), np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("qos_generative")
    build_zoo(root, [ENGINE])  # on the cpu, no [qos]: a best-effort tenant of weight 1
    write_null_model(
        root,
        "protected",
        "max_batch_size = 1\n"
        + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
        + "[backend_options]\ndelay_us = 2000\n[qos]\nlatency_objective_us = 100000\n",
    )
    with serving(root, metrics_port=0) as running:
        yield running


def _granted(server: LocalServer, model: str) -> float:
    """Slots the cpu's scheduler granted `model` (batches, or an engine's steps): its metrics."""
    port = server.server.ports["metrics"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).text
    total, prefix = 0.0, "dlscale_qos_batches_total{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'model="{model}"' in line and 'device="cpu"' in line:
            decision = line.split('decision="')[1].split('"')[0]
            assert decision in DECISIONS
            total += float(line.rsplit(" ", 1)[1])
    return total


def _flood(server: LocalServer, stop: threading.Event, streamed: list[int]) -> None:
    """One client streaming generations back to back until `stop`; counts its streams."""
    url = f"http://{server.http_url}/v2/models/{ENGINE}/generate_stream"
    body = {"text_input": "the device is shared by", "parameters": FLOOD}
    with httpx.Client(timeout=PATIENCE_S) as client:
        while not stop.is_set():
            with client.stream("POST", url, json=body) as response:
                assert response.status_code == 200
                for _ in response.iter_lines():
                    pass
            streamed.append(1)


def _protected(server: LocalServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=PATIENCE_S)
    inputs = [httpclient.InferInput("x", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(ROW)
    try:
        assert client.infer("protected", inputs).as_numpy("y").shape == (1, 4)
    finally:
        client.close()


def test_a_flood_of_streams_leaves_the_protected_model_its_slots(server: LocalServer) -> None:
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
        steps_before = _granted(server, ENGINE)
        assert steps_before > 0  # the engine's steps take the cpu's slots
        for _ in range(PROTECTED_COUNT):
            _protected(server)  # every one answered beside the flood
        steps_during = _granted(server, ENGINE) - steps_before
    finally:
        stop.set()
        for thread in floods:
            thread.join(PATIENCE_S)
    # The pool granted the protected model a slot for each of its requests while the engine
    # kept being granted its steps: one device, both kinds interleaved by one scheduler.
    assert _granted(server, "protected") == PROTECTED_COUNT
    assert steps_during > 0
    assert streamed  # the flood was served
    # The engine has nothing left to step: it gave its last slot back, so the device is free.
    _protected(server)
    assert _granted(server, "protected") == PROTECTED_COUNT + 1
