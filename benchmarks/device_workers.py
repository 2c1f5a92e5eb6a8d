"""Per-device worker processes behind one port (`dlscale serve --device-workers N`), no Ray.

    python -m benchmarks.device_workers [--repeats 3] [--duration 10]

A null-backend model on a simulated device (100 ms per batch of up to 8 rows, the sleep holds no
CPU, one batch at a time per process: each worker process is one device) served by
`dlscale serve REPO --device-workers N` for N = 1, 2, 4, each driven through the router's REST
port by 16 closed-loop streams per worker (two full batches waiting on every device). Throughput
is set against linear (N x one worker) and against `dlscale plan serve --profile`'s prediction
from the same model's profile taken in process (workers = devices). The machine's load average
is recorded beside each run: the development VM is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.models import BenchModel
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    dlscale_exe,
    free_port,
    thread_env,
    wait_ready,
)
from benchmarks.harness.statistics import machine, record

#: The simulated device: one batch of up to 8 rows takes this long, whatever its size.
DELAY_US = 100_000
SLEEPER = BenchModel("sleeper", "input", "output", (16,), 8, 0)
WORKERS = (1, 2, 4)
STREAMS_PER_WORKER = 16
#: The planner's p99 bound: 10 batch times, loose enough that its peak is near the capacity.
PLAN_P99 = "1s"


def sleeper_repository() -> Path:
    """The simulated device's model: FP32 [N, 16] echoed after DELAY_US per batch."""
    repo = WORK / "repo-device-workers"
    folder = repo / SLEEPER.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.null").touch()
    (folder / "config.toml").write_text(
        f'backend = "null"\nmax_batch_size = {SLEEPER.max_batch_size}\n'
        "[batching]\nmax_queue_delay_us = 0\n"
        f'[backend_options]\ndelay_us = {DELAY_US}\nsimulated_device = "device"\n'
        '[[inputs]]\nname = "input"\ndatatype = "FP32"\nshape = [16]\n'
        '[[outputs]]\nname = "output"\ndatatype = "FP32"\nshape = [16]\n'
    )
    return repo


def planned_rate(repo: Path) -> float:
    """One device's profile in process (`dlscale bench --repo`), then `dlscale plan serve
    --profile`: the peak rate of one device (one worker)."""
    profile = WORK / "device-workers-profile"
    subprocess.run(
        [dlscale_exe(), "bench", "--repo", str(repo), "--model", SLEEPER.name, "--scenario",
         "offline", "--duration", "10s", "--out", str(profile), "--no-progress"],
        check=True, stdout=subprocess.DEVNULL, env=thread_env(),
    )  # fmt: skip
    out = WORK / "device-workers-plan.json"
    subprocess.run(
        [dlscale_exe(), "plan", "serve", "--profile", str(profile / "report.json"), "--qps",
         "100", "--p99", PLAN_P99, "--devices", "CPU", "--flops-per-sample", "1",
         "--bytes-per-sample", "1", "--json", str(out)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return float(json.loads(out.read_text())[0]["peak_rate_per_device"])


def start_fleet(repo: Path, workers: int) -> ServerProcess:
    """`dlscale serve REPO --device-workers N` on a free port, ready through its router."""
    port = free_port()
    argv = [dlscale_exe(), "serve", str(repo), "--device-workers", str(workers),
            "--http-port", str(port), "--grpc-port", "-1", "--metrics-port", "-1",
            "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(argv, text=True, env=thread_env(), start_new_session=True)
    server = ServerProcess(f"device-workers-{workers}", proc, port)
    wait_ready(server, [f"/v2/models/{SLEEPER.name}/ready"])
    return server


def run(repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """Each worker count in turn (one fleet each), `repeats` closed-loop runs on it."""
    repo = sleeper_repository()
    body = SLEEPER.json_body()
    for n in WORKERS:
        server = start_fleet(repo, n)
        try:
            wire = build_request(HOST, server.port, f"/v2/models/{SLEEPER.name}/infer", body)
            for rep in range(repeats):
                load_before = os.getloadavg()[0]
                streams = STREAMS_PER_WORKER * n
                r = uvloop.run(closed_loop(HOST, server.port, wire, streams, duration, 3.0))
                record(rows, bench="device-workers", server="dlscale", model=SLEEPER.name,
                       concurrency=streams, workers=n, rep=rep, load_before=load_before,
                       load_after=os.getloadavg()[0], **r.summary())  # fmt: skip
        finally:
            server.stop()


def scaling_table(rows: list[dict[str, Any]], planned: float) -> str:
    """Median throughput per worker count against linear (N x 1 worker) and the planner."""
    by_n: dict[int, list[float]] = {}
    for row in rows:
        by_n.setdefault(row["workers"], []).append(row["throughput"])
    one = statistics.median(by_n[1])
    lines = ["| workers | throughput (req/s) | x linear | planned (req/s) | measured / planned |",
             "|---|---|---|---|---|"]  # fmt: skip
    for n in sorted(by_n):
        got = statistics.median(by_n[n])
        lines.append(f"| {n} | {got:.1f} | {got / (n * one):.2f} | {n * planned:.1f} | "
                     f"{got / (n * planned):.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    planned = planned_rate(sleeper_repository())
    run(args.repeats, args.duration, rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"device-workers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, "planned": planned}, indent=1))
    for row in rows:
        load = f"load {row['load_before']:.1f}->{row['load_after']:.1f}"
        print(f"workers {row['workers']} rep {row['rep']}: {row['throughput']:.1f} req/s, "
              f"errors {row.get('errors', 0)}, {load}")  # fmt: skip
    print(f"\nplanned per worker: {planned:.1f} req/s")
    print(scaling_table(rows, planned))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
