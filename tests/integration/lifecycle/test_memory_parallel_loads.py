"""Issue 36, the cold tail: loads on demand side by side on the host, within the budget.

Loads of a model whose size an earlier load measured run a few at once, each reserving that size
in the memory ledger before it starts; a model never measured loads alone, so that the growth
read around it is its own. Each test floods a real server (tritonclient over REST, 127.0.0.1
port 0) with requests for cold models while a thread samples its /metrics, and asserts what the
samples and the answers show, never a time.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as triton
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

MiB = 2**20
BUDGET = 40 * MiB
#: A null model y = x over two floats whose warm-up and batches each sleep 400 ms: loads asked
#: for at once overlap, however late a busy machine runs the client's threads.
SLOW = (
    "max_batch_size = 4\n[backend_options]\ndelay_us = 400000\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
_RESIDENT = re.compile(r'^dlscale_memory_resident_bytes\{device="cpu"\} (\S+)$', re.M)
_RUNNING = re.compile(r'^dlscale_model_loads_running\{device="cpu"\} (\S+)$', re.M)


def ten_mib_models(root: Path, count: int, config: str = SLOW, prefix: str = "m") -> list[str]:
    """Null models holding 10 MiB each: a load holds at least its files (a sparse pad here)."""
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        folder = write_null_model(root, name, config)
        with open(folder / "1" / "pad.bin", "wb") as pad:
            pad.truncate(10 * MiB)
    return names


def ask(url: str, model: str) -> str:
    """One request on its own connection: 'ok' or the error's status and message."""
    with triton.InferenceServerClient(url, network_timeout=120) as client:
        x = triton.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        try:
            assert client.infer(model, [x]).as_numpy("y").tolist() == [[1.0, 1.0]]
        except InferenceServerException as exc:
            return f"{exc.status()}: {exc.message()}"
    return "ok"


@contextmanager
def sampled(server: LocalServer) -> Iterator[list[tuple[float, float]]]:
    """(resident bytes, loads running) on the host, from /metrics, as often as it answers."""
    url = f"http://127.0.0.1:{server.server.ports['metrics']}/metrics"
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                text = http.get(url).text
                resident, running = _RESIDENT.search(text), _RUNNING.search(text)
                samples.append(
                    (float(resident[1]) if resident else 0.0, float(running[1]) if running else 0.0)
                )

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(60)


def resident_sizes(server: LocalServer) -> dict[str, int]:
    with triton.InferenceServerClient(server.http_url) as client:
        rows = client.get_model_repository_index()
    return {r["name"]: r["memory"]["cpu"] for r in rows if r["state"] == "READY"}


def on_demand(root: Path) -> AbstractContextManager[LocalServer]:
    """A server loading `root`'s models on demand under BUDGET, four loads at once."""
    return serving(
        root,
        model_control="on-demand",
        load_models=(),
        memory_budget=(("cpu", BUDGET),),
        parallel_loads=4,
        metrics_port=0,
    )


def test_cold_models_at_once_load_side_by_side_and_the_budget_holds(tmp_path: Path) -> None:
    names = ten_mib_models(tmp_path, 8)
    with on_demand(tmp_path) as server:
        with triton.InferenceServerClient(server.http_url, network_timeout=120) as client:
            for name in names:  # each measured once, alone; the last four stay resident, idle
                client.load_model(name)
        assert sorted(resident_sizes(server)) == names[4:]
        with sampled(server) as samples, ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda n: ask(server.http_url, n), names[:4]))
        assert outcomes == ["ok"] * 4, outcomes
        ledger = server.server.manager.memory
        assert ledger.most_running()["cpu"] >= 2  # side by side
        # Each load reserved its 10 MiB before it started: four idle models made room for four
        # loads, and the ledger (held and reserved) never went above the budget: at its peak,
        # and in every sample of /metrics a client took meanwhile.
        assert ledger.peak["cpu"] <= BUDGET, ledger.peak
        assert samples and max(resident for resident, _ in samples) <= BUDGET, samples
        now = resident_sizes(server)
        assert sorted(now) == names[:4] and sum(now.values()) <= BUDGET, now


def test_models_never_measured_load_alone(tmp_path: Path) -> None:
    names = ten_mib_models(tmp_path, 4)
    with on_demand(tmp_path) as server:
        with sampled(server) as samples, ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda n: ask(server.http_url, n), names))
        assert outcomes == ["ok"] * 4, outcomes
        # First loads: their growth is read around each, so none ran beside another.
        assert server.server.manager.memory.most_running() == {"cpu": 1}
        assert samples and max(running for _, running in samples) <= 1, samples
        assert sorted(resident_sizes(server)) == names


def test_a_load_that_fits_only_after_another_waits_for_it_rather_than_refuse(
    tmp_path: Path,
) -> None:
    # Room for one model beside the pinned one; two loads over the repository API at once (no
    # request holds either): one at a time, the second would evict the first. Side by side, the
    # second cannot make room while the first holds its reservation: it waits for it to end.
    ten_mib_models(tmp_path, 1, SLOW + "[memory]\npinned = true\n", prefix="hot")
    slow = SLOW.replace("delay_us = 400000", "delay_us = 1000000")  # both loads overlap
    a, b = ten_mib_models(tmp_path, 2, slow)
    with (
        serving(
            tmp_path,
            model_control="on-demand",
            load_models=("hot0",),
            memory_budget=(("cpu", 20 * MiB),),
            parallel_loads=4,
        ) as server,
        triton.InferenceServerClient(server.http_url, network_timeout=120) as client,
    ):
        client.load_model(a)  # each measured once, alone
        client.load_model(b)
        client.unload_model(b)

        def load(name: str) -> str:
            with triton.InferenceServerClient(server.http_url, network_timeout=120) as own:
                try:
                    own.load_model(name)
                except InferenceServerException as exc:
                    return f"{exc.status()}: {exc.message()}"
            return "ok"

        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(load, [a, b]))
        assert outcomes == ["ok", "ok"], outcomes
        now = resident_sizes(server)
        assert "hot0" in now and len(now) == 2 and sum(now.values()) <= 20 * MiB, now
