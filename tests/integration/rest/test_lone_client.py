"""A lone closed-loop client is not made to wait for company it cannot have.

A model whose queue delay is 30 s: a client that sends each request once it has the previous
answer is alone in flight every time, so none of its requests may wait that delay. The
server's own statistics (Triton's statistics extension, read with tritonclient) say how long
they queued; a request that had waited the delay would show 30 s there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.models import identity_graph, write_model
from tests.toolkit.repositories import BATCHED
from tests.toolkit.server import LocalServer, serving

DELAY_US = 30_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root: Path = tmp_path_factory.mktemp("lone")
    write_model(root, "identity", identity_graph(16), BATCHED.format(max_batch=8, delay=DELAY_US))
    with serving(root) as running:
        yield running


def test_a_lone_client_never_waits_the_queue_delay(server: LocalServer) -> None:
    client = th.InferenceServerClient(server.http_url, network_timeout=120.0)
    try:
        for n in range(5):  # the adaptive delay alone let only the first go at once
            x = np.full((1, 16), n, np.float32)
            tensor = th.InferInput("input", [1, 16], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer("identity", [tensor])
            np.testing.assert_array_equal(result.as_numpy("output"), x)
        stats = client.get_inference_statistics("identity")["model_stats"][0]
    finally:
        client.close()
    queue = stats["inference_stats"]["queue"]
    assert int(queue["count"]) == 5
    assert int(queue["ns"]) < DELAY_US * 1000  # all five together waited less than one delay
