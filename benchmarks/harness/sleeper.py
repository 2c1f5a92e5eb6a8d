"""A simulated device for scaling runs: a null model that holds its device a fixed time per
batch, one device's capacity planned by `dlscale plan serve`, and the table against linear.

The null backend's sleep holds no CPU, so N replicas (or device workers) of it stand for N
accelerators on a host with two cores; what limits the fleet is then the data path around them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.harness.models import BenchModel
from benchmarks.harness.servers import WORK, dlscale_exe, thread_env

#: FP32 [N, 16] echoed; batches of up to 8 rows, each held the same time whatever its size.
SLEEPER = BenchModel("sleeper", "input", "output", (16,), 8, 0)


def sleeper_repository(name: str, delay_us: int, device: str | None = None) -> Path:
    """WORK/NAME holding the sleeper, DELAY_US per batch (on `device`, a simulated device)."""
    repo = WORK / name
    folder = repo / SLEEPER.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.null").touch()
    held = f'simulated_device = "{device}"\n' if device else ""
    (folder / "config.toml").write_text(
        f'backend = "null"\nmax_batch_size = {SLEEPER.max_batch_size}\n'
        "[batching]\nmax_queue_delay_us = 0\n"
        f"[backend_options]\ndelay_us = {delay_us}\n{held}"
        '[[inputs]]\nname = "input"\ndatatype = "FP32"\nshape = [16]\n'
        '[[outputs]]\nname = "output"\ndatatype = "FP32"\nshape = [16]\n'
    )
    return repo


def plan_one_device(repo: Path, p99: str) -> tuple[float, dict[str, Any]]:
    """One device's profile in process (`dlscale bench --repo`, its batcher and backend), then
    `dlscale plan serve --profile`: the peak rate of one device, and the profile it came from."""
    out = WORK / f"{repo.name}-profile"
    subprocess.run(
        [dlscale_exe(), "bench", "--repo", str(repo), "--model", SLEEPER.name, "--scenario",
         "offline", "--duration", "10s", "--out", str(out), "--no-progress"],
        check=True, stdout=subprocess.DEVNULL, env=thread_env(),
    )  # fmt: skip
    plan = WORK / f"{repo.name}-plan.json"
    subprocess.run(
        [dlscale_exe(), "plan", "serve", "--profile", str(out / "report.json"), "--qps", "100",
         "--p99", p99, "--devices", "CPU", "--flops-per-sample", "1",
         "--bytes-per-sample", "1", "--json", str(plan)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    profile = json.loads((out / "report.json").read_text())["profile"]
    return float(json.loads(plan.read_text())[0]["peak_rate_per_device"]), profile


def scaling_table(by_count: dict[int, list[float]], planned: float, unit: str) -> str:
    """Median throughput per count of `unit` (replicas, workers) against linear (N x one) and
    the planner's N x `planned`."""
    one = statistics.median(by_count[1])
    lines = [f"| {unit} | throughput (req/s) | x linear | planned (req/s) | measured / planned |",
             "|---|---|---|---|---|"]  # fmt: skip
    for n in sorted(by_count):
        got = statistics.median(by_count[n])
        lines.append(f"| {n} | {got:.1f} | {got / (n * one):.2f} | {n * planned:.1f} | "
                     f"{got / (n * planned):.2f} |")  # fmt: skip
    return "\n".join(lines)
