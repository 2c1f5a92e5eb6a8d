"""Issue 36: an evicted model's instances close beside the load that made room for it.

A real server loading on demand under a budget (tritonclient over REST, 127.0.0.1 port 0)
holds a Python model whose unload (`finalize`) waits for a marker file the test writes. A
cold model of known size that evicts it is answered while it is still closing; a load that
reads memory (its file's first) waits for the close first; the ledger stays within the budget
throughout (docs/memory.md, "Sizes known by file").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tests.toolkit.models import write_null_model
from tests.toolkit.python_models import write_python_model
from tests.toolkit.server import LocalServer, serving

from dlscale.serving.served import ModelState

MiB = 2**20
#: Two models of 40 MiB fit, not three (the Python model measures 40 to 60 MiB: its files, or
#: the growth of the process's first Python model, which imports the backend's modules).
BUDGET = 100 * MiB
TENSORS = (
    "max_batch_size = 4\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
#: y = x; its unload waits for the marker (at most two minutes: a safety net, not a time).
SLOW_CLOSE = """
import os
import time

import triton_python_backend_utils as pb_utils

MARKER = {marker!r}


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", x)]) for x in xs]

    def finalize(self):
        deadline = time.monotonic() + 120
        while not os.path.exists(MARKER) and time.monotonic() < deadline:
            time.sleep(0.01)
"""


def pad(folder: Path) -> None:
    with open(folder / "1" / "pad.bin", "wb") as out:
        out.truncate(40 * MiB)  # a load holds at least its files: 40 MiB


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[LocalServer]:
    root = tmp_path / "repo"
    source = write_null_model(tmp_path / "source", "source", TENSORS)
    pad(source)
    for name in ("b0", "b1", "b2"):  # one file under three names: its size known after two
        (root / name).mkdir(parents=True)
        (root / name / "config.toml").write_text('backend = "null"\n' + TENSORS)
        (root / name / "1").symlink_to(source / "1", target_is_directory=True)
    pad(write_null_model(root, "fresh", TENSORS))
    code = SLOW_CLOSE.format(marker=str(tmp_path / "release"))
    pad(write_python_model(root, "slow", code, TENSORS))
    with serving(
        root, model_control="on-demand", load_models=(), memory_budget=(("cpu", BUDGET),)
    ) as started:
        try:
            yield started
        finally:
            (tmp_path / "release").touch()  # whatever failed, the server may stop


def answer(server: LocalServer, name: str) -> list[list[float]]:
    with triton.InferenceServerClient(server.http_url, network_timeout=120) as client:
        x = triton.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        return client.infer(name, [x]).as_numpy("y").tolist()  # type: ignore[no-any-return]


def evicting_slow(server: LocalServer, pool: ThreadPoolExecutor, name: str) -> Future[object]:
    """`slow` loaded and the least recently used; then a request for `name`, which evicts it,
    sent from `pool`, once `slow`'s unload has begun."""
    for model in ("b0", "b1", "slow", "b1"):  # b0 evicted for slow; b1 used after slow
        assert answer(server, model) == [[1.0, 1.0]], model
    manager = server.dataplane.manager
    sent = pool.submit(answer, server, name)
    for _ in range(6000):  # bounded: the eviction begins within the request's load
        if manager.state("slow") is ModelState.UNLOADING:
            break
        time.sleep(0.01)
    assert manager.state("slow") is ModelState.UNLOADING
    return sent


def test_a_load_of_known_size_is_answered_while_its_victim_closes(
    server: LocalServer, tmp_path: Path
) -> None:
    manager = server.dataplane.manager
    with ThreadPoolExecutor(1) as pool:
        sent = evicting_slow(server, pool, "b2")
        # Before, the cold request waited for the victim's unload: here, for the marker.
        assert sent.result(timeout=60) == [[1.0, 1.0]]
        assert manager.state("slow") is ModelState.UNLOADING  # still closing: marker absent
        held = manager.memory.used()["cpu"]
        assert held <= BUDGET and manager.memory.peak["cpu"] <= BUDGET
        (tmp_path / "release").touch()
    for _ in range(6000):
        if manager.state("slow") is ModelState.UNAVAILABLE:
            break
        time.sleep(0.01)
    assert manager.state("slow") is ModelState.UNAVAILABLE
    assert answer(server, "slow") == [[1.0, 1.0]]  # loaded again after its close
    assert manager.memory.peak["cpu"] <= BUDGET


def test_a_load_that_reads_memory_waits_for_its_victim_to_close(
    server: LocalServer, tmp_path: Path
) -> None:
    manager = server.dataplane.manager
    with ThreadPoolExecutor(1) as pool:
        sent = evicting_slow(server, pool, "fresh")  # its file's first load: measured
        # A free within the reading would hide its growth: it cannot finish while the victim
        # has not closed, which it cannot do before the marker exists.
        with pytest.raises(TimeoutError):
            sent.result(timeout=2)
        (tmp_path / "release").touch()
        assert sent.result(timeout=60) == [[1.0, 1.0]]
    assert manager.state("slow") is ModelState.UNAVAILABLE
    assert manager.memory.peak["cpu"] <= BUDGET
