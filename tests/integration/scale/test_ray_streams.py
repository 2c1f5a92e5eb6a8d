"""Streams behind the Ray Serve ingress: REST generate_stream and gRPC ModelStreamInfer reach a
replica's stream path; a client that disconnects frees the replica's sequence slot."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray Serve tests need the [ray] extra (ray[serve])")

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from tests.integration.scale.conftest import Deployed

PATIENCE_S = 60.0


def _url(deployed: Deployed, route: str) -> str:
    return f"http://{deployed.http_url}/v2/models/ticker/{route}"


def _ticks(deployed: Deployed, count: int, into: list[Any]) -> None:
    body = {"COUNT": count}
    with httpx.stream(
        "POST", _url(deployed, "generate_stream"), json=body, timeout=PATIENCE_S
    ) as r:
        into.append([json.loads(x[5:])["TICK"] for x in r.iter_lines() if x.startswith("data:")])


def test_generate_stream_through_the_ingress(deployed: Deployed) -> None:
    got: list[Any] = []
    _ticks(deployed, 3, got)
    assert got == [[0, 1, 2]]


def test_a_disconnect_behind_the_ingress_frees_the_replicas_slot(deployed: Deployed) -> None:
    got: list[Any] = []
    held = httpx.stream("POST", _url(deployed, "generate_stream"), json={"COUNT": -1}, timeout=60)
    with held as response:
        lines = response.iter_lines()
        assert next(x for x in lines if x.startswith("data:"))
        waiting = threading.Thread(target=_ticks, args=(deployed, 2, got))
        waiting.start()
    # The ticker takes one sequence at a time: the second finishes only once the first is gone.
    waiting.join(PATIENCE_S)
    assert got == [[0, 1]]


def test_model_stream_infer_through_the_ingress(deployed: Deployed) -> None:
    client = grpcclient.InferenceServerClient(deployed.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], np.int32))
    client.async_stream_infer("ticker", [count], enable_empty_final_response=True)
    answers = [results.get(timeout=PATIENCE_S) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in answers)
    assert [r.as_numpy("TICK").tolist() for r, _ in answers[:2]] == [[0], [1]]
    assert answers[2][0].get_response().parameters["triton_final_response"].bool_param
