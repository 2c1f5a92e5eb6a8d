"""Issue 36, the cold tail: a load on demand whose requests have all gone is dropped.

Requests for cold models that time out while their loads wait for a turn leave loads nobody
waits for. Such a load must neither hold up the loads queued behind it nor count against the
bound on cold models waiting (`--max-cold-loads`), or a later request is refused (503) for
room that only abandoned loads take. The test performs it on a real server (tritonclient over
REST, 127.0.0.1 port 0) and asserts what was loaded, dropped and refused, never a time.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as triton
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.waiting import until
from tritonclient.utils import InferenceServerException

#: A null model y = x whose load warms up with ten batches of 100 ms (a load takes at least
#: 1 s, so the requests below all arrive while the first loads still run) and whose requests
#: take one batch.
SLOW_LOAD = (
    "max_batch_size = 4\n[[warmup]]\ncount = 10\n[backend_options]\ndelay_us = 100000\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)


def ask(url: str, model: str, timeout_us: int = 0) -> str:
    """One request on its own connection: 'ok' or the error's status and message."""
    with triton.InferenceServerClient(url, network_timeout=120) as client:
        x = triton.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        try:
            assert client.infer(model, [x], timeout=timeout_us or None).as_numpy("y") is not None
        except InferenceServerException as exc:
            return f"{exc.status()}: {exc.message()}"
    return "ok"


def metric(server: LocalServer, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, (name, text)
    return float(found[1])


def ready(server: LocalServer) -> set[str]:
    with triton.InferenceServerClient(server.http_url) as client:
        return {r["name"] for r in client.get_model_repository_index() if r["state"] == "READY"}


def test_loads_nobody_waits_for_are_dropped_and_refuse_no_later_request(tmp_path: Path) -> None:
    for name in ("first", "second", "gone1", "gone2", "later"):
        write_null_model(tmp_path, name, SLOW_LOAD)
    with (
        serving(
            tmp_path,
            model_control="on-demand",
            load_models=(),
            parallel_loads=1,  # loads take turns; two at most pass the on-demand gate
            max_cold_loads=4,
            metrics_port=0,
        ) as server,
        ThreadPoolExecutor(3) as pool,
    ):
        url = server.http_url
        patient = [pool.submit(ask, url, name) for name in ("first", "second")]
        until(lambda: metric(server, "dlscale_model_loads_waiting") == 2)
        # Two requests give up at once, while their loads queue behind the two running.
        gone = [ask(url, name, timeout_us=1000) for name in ("gone1", "gone2")]
        assert all(g.startswith("503: ") and "still loading" in g for g in gone), gone
        # Four cold models were asked for, the most that may wait: only two still have a
        # request waiting, so a fifth is served, not refused.
        later = pool.submit(ask, url, "later")
        assert [f.result() for f in (*patient, later)] == ["ok"] * 3
        until(lambda: metric(server, "dlscale_model_loads_waiting") == 0)
        assert ready(server) == {"first", "second", "later"}
        assert metric(server, "dlscale_model_loads_dropped_total") == 2
        assert metric(server, "dlscale_model_loads_on_demand_total") == 3
        assert metric(server, "dlscale_model_loads_refused_total") == 0
