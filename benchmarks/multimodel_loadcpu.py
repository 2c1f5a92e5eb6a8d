"""The server's CPU time per load on demand, less a resident request's (issue 36, BENCHMARKS.md).

    python -m benchmarks.multimodel_loadcpu --copies 40 --loads 200 --rounds 3

Wall time on a shared machine follows the neighbours; CPU time spent by the server process
does not. The harness's 256-1024-10 MLP is served under `--copies` names by `dlscale serve
--model-control on-demand` under a budget that fits about ten (measured as benchmarks/
multimodel.py does). Asking for the names in turn, one request at a time, makes every request a
load (least recently used eviction never keeps the next name of a cycle longer than the budget);
asking for one resident name gives a resident request's cost. Each round measures both, and the
figure is (CPU over the loads - loads x CPU of a resident request) / loads; the median of the
rounds is printed. `--py-spy FILE` also records the server's threads during one round of loads
(py-spy's raw format, one line per stack with its sample count).
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks.harness.models import mlp_copies
from dlscale.bench.multimodel_run import RepoServer

_BODY = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]}
_LOADS = re.compile(r"^dlscale_model_loads_on_demand_total (\S+)$", re.M)


def cpu_s(pid: int) -> tuple[float, float]:
    """User + system CPU seconds so far of the server and its children, and of the server's
    main thread alone (its event loop: what the requests of resident models share)."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    kids = sum(sum(c.cpu_times()[:2]) for c in proc.children(recursive=True))
    loop = next(t for t in proc.threads() if t.id == pid)
    return times.user + times.system + kids, loop.user_time + loop.system_time


def spent(pid: int, before: tuple[float, float]) -> tuple[float, float]:
    now = cpu_s(pid)
    return now[0] - before[0], now[1] - before[1]


def probe(repo: Path, names: list[str], log: Path) -> int:
    """The bytes ten copies hold: the first copy's figure plus nine times the others' median."""
    with RepoServer(repo, ["--model-control", "on-demand"], log) as server:
        for name in names[:11]:
            httpx.post(f"{server.url}/v2/models/{name}/infer", json=_BODY, timeout=120)
        rows = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=60).json()
    sizes = {r["name"]: r["memory"]["cpu"] for r in rows if "memory" in r}
    return int(sizes[names[0]] + 9 * statistics.median(sizes[n] for n in names[1:11]))


def loads_done(metrics_url: str | None) -> float:
    """The server's count of loads on demand (0 without its metrics)."""
    if metrics_url is None:
        return 0.0
    found = _LOADS.search(httpx.get(f"{metrics_url}/metrics", timeout=10).text)
    return float(found.group(1)) if found else 0.0


def ask(client: httpx.Client, url: str, name: str) -> None:
    answer = client.post(f"{url}/v2/models/{name}/infer", json=_BODY, timeout=120)
    answer.raise_for_status()


def one_round(
    server: RepoServer, names: list[str], loads: int, spy: Path | None, native: bool
) -> Round:
    """A round's figures in ms: CPU per load less a resident request's (all threads, and the
    event loop's thread), and a resident request's; with the loads counted."""
    pid = server.pid
    assert pid is not None
    with httpx.Client() as client:
        hot = names[-1]
        ask(client, server.url, hot)
        before = cpu_s(pid)
        for _ in range(4 * loads):
            ask(client, server.url, hot)
        resident = [x / (4 * loads) for x in spent(pid, before)]
        counted = loads_done(server.metrics_url())
        recorder = _spy(pid, spy, native) if spy is not None else None
        before = cpu_s(pid)
        for i in range(loads):
            ask(client, server.url, names[i % len(names)])
        total, loop = spent(pid, before)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            recorder.wait(60)
        counted = loads_done(server.metrics_url()) - counted
    per_load = (total - loads * resident[0]) / max(counted, 1)
    per_load_loop = (loop - loads * resident[1]) / max(counted, 1)
    return Round(per_load * 1e3, per_load_loop * 1e3, resident[0] * 1e3, counted, rss_mib(pid))


def rss_mib(pid: int) -> float:
    """The server's process tree's resident MiB now (what the budget's bytes live in)."""
    proc = psutil.Process(pid)
    tree = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in tree) / 2**20


@dataclass
class Round:
    """One round's figures (ms of CPU)."""

    per_load: float
    per_load_loop: float
    per_resident: float
    loads: float
    rss_mib: float


def _spy(pid: int, out: Path, native: bool) -> subprocess.Popen[bytes]:
    """py-spy recording the server's threads; with C frames it pauses the server per sample."""
    spy = Path(sys.executable).parent / "py-spy"
    line = [str(spy), "record", "-p", str(pid), "-r", "200", "--threads", "-f", "raw", "-o"]
    mode = ["--native"] if native else ["--nonblocking"]
    return subprocess.Popen([*line, str(out), *mode], stdout=subprocess.DEVNULL)


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=40)
    parser.add_argument("--loads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--py-spy", type=Path, default=None)
    parser.add_argument("--native", action="store_true", help="py-spy records C frames too")
    parser.add_argument("--out", type=Path, default=Path("bench-results/multimodel-loadcpu"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        repo, names = mlp_copies(Path(scratch), args.copies)
        budget = probe(repo, names, args.out / "probe.log")
        flags = ["--model-control", "on-demand", "--memory-budget", f"cpu={budget}"]
        with RepoServer(repo, flags, args.out / "server.log") as server:
            for name in names:  # the first loads of every name: ONNX Runtime's set-up, graphs
                httpx.post(f"{server.url}/v2/models/{name}/infer", json=_BODY, timeout=120)
            figures = []
            for i in range(args.rounds):
                spy = args.py_spy if i == 0 else None
                r = one_round(server, names, args.loads, spy, args.native)
                figures.append(r)
                print(f"round {i + 1}: {r.per_load:.2f} ms per load, {r.per_load_loop:.2f} ms "
                      f"of it on the event loop ({r.loads:.0f} loads); resident request "
                      f"{r.per_resident:.3f} ms; server RSS {r.rss_mib:.0f} MiB")  # fmt: skip
    print(f"budget cpu={budget / 2**20:.1f} MiB; median CPU per load "
          f"{statistics.median(f.per_load for f in figures):.2f} ms, on the event loop "
          f"{statistics.median(f.per_load_loop for f in figures):.2f} ms; per resident request "
          f"{statistics.median(f.per_resident for f in figures):.3f} ms; load average "
          f"{', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
