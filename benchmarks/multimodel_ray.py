"""Many models: dlscale's loading on demand against Ray Serve's model multiplexing (issue 36).

    python -m benchmarks.multimodel_ray [--copies 100] [--rate 30] [--duration 20] \
        [--closed-duration 10] [--concurrency 16] [--rounds 3] [--max-models 10]

The harness's 256-1024-10 MLP (benchmarks/harness/models.py) under `--copies` names
(dlscale.bench.multimodel_run.copies), served by
- dlscale: `dlscale serve --model-control on-demand --memory-budget cpu=B`, B the bytes ten
  copies hold as a probe server measured them (harness/budget.py);
- ray-serve: Ray Serve's `@serve.multiplexed(max_num_models_per_replica=10)` over the same files,
  one replica, ONNX Runtime with dlscale's session options (harness/multiplex_app.py);
- ray-serve-all: the same holding every copy (no eviction: Ray's best case on this mix, for the
  budget's bytes hold more than ten copies once the first, which carries ONNX Runtime's
  one-time set-up, has been evicted).
Each round starts every arm afresh (no model loaded), in turn, the order rotating between rounds,
and drives each with the same client (harness/multiplex_load.py): first the seeded Zipf(1.1)
mix of Poisson arrivals at `--rate` for `--duration` s (open loop: the latency of resident and
cold requests), then `--concurrency` closed-loop streams over the mix's models for
`--closed-duration` s (the ceiling). The target: dlscale at least 2x Ray's throughput or at
most half its p99 (the median of the rounds' paired ratios), against each Ray arm. CPU is the
servers' processes' (Ray's: its whole cluster, started for the run) per answered request.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvloop

from benchmarks.harness.budget import budget_for
from benchmarks.harness.models import MLP, mlp_copies
from benchmarks.harness.multiplex_load import closed_mix, open_mix, wires
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    ROOT,
    cpu_seconds,
    free_port,
    start_listening,
)
from benchmarks.harness.statistics import machine, paired_ratios, record
from dlscale.bench.multimodel import IndexSampler, Mix, Phase, Sent
from dlscale.bench.multimodel_report import summary
from dlscale.bench.multimodel_run import RepoServer, mean_load_s

#: dlscale under the budget; Ray capped at the budget's model count; Ray holding every model
#: (no load after the first of each: the best Ray can do on this mix, whatever the cap).
ARMS = ("dlscale", "ray-serve", "ray-serve-all")
Load = Callable[[int, IndexSampler], Coroutine[Any, Any, list[Sent]]]


@dataclass(frozen=True)
class Arm:
    """A server started for one round: its port, its process, its mean load time so far."""

    port: int
    pid: int
    mean_load_s: Callable[[], float | None]


@contextmanager
def dlscale_arm(repo: Path, budget: int, log: Path, extra: list[str]) -> Iterator[Arm]:
    """`dlscale serve` loading on demand under the budget (and `extra` flags)."""
    flags = ["--model-control", "on-demand", "--memory-budget", f"cpu={budget}", *extra]
    with RepoServer(repo, flags, log) as server:
        assert server.pid is not None

        def mean() -> float | None:
            found = mean_load_s(server.metrics_url())  # its dlscale_model_load_seconds
            return found[0] if found else None

        yield Arm(int(server.url.rsplit(":", 1)[1]), server.pid, mean)


@contextmanager
def ray_arm(repo: Path, max_models: int) -> Iterator[Arm]:
    """The Ray Serve multiplexing peer in a process (and cluster) of its own."""
    argv = ["-m", "benchmarks.harness.multiplex_app", "--repo", str(repo.resolve()),
            "--port", str(free_port()), "--max-models", str(max_models)]  # fmt: skip
    # Ray's worker processes import the deployment's module: the checkout's root on their path.
    server = start_listening("ray-multiplex", argv, PYTHONPATH=str(ROOT))

    def mean() -> float | None:
        found = httpx.get(f"http://{HOST}:{server.port}/loads", timeout=30).json()
        return found["seconds"] / found["loads"] if found["loads"] else None

    try:
        yield Arm(server.port, server.proc.pid, mean)
    finally:
        server.stop()


def measure(arm: Arm, load: Load) -> dict[str, Any]:
    """One load against the arm's server, its index sampled, its CPU counted."""
    loads = [os.getloadavg()[0]]
    with IndexSampler(f"http://{HOST}:{arm.port}", arm.pid) as sampler:
        cpu, start = cpu_seconds(arm.pid), time.perf_counter()
        sent = uvloop.run(load(arm.port, sampler))
        elapsed, cpu = time.perf_counter() - start, cpu_seconds(arm.pid) - cpu
    loads.append(os.getloadavg()[0])
    figures = summary(Phase("mix", sent, sampler.samples))
    figures.pop("models")
    figures["mean_load_s"] = arm.mean_load_s()
    answered = [s.latency_s for s in sent if s.status == 200]
    return {
        **figures,
        "throughput": len(answered) / elapsed,
        "p50_s": float(np.percentile(answered, 50)) if answered else None,
        "p99_s": float(np.percentile(answered, 99)) if answered else None,
        "errors": len(sent) - len(answered),
        "cpu_ms_per_answer": 1e3 * cpu / max(len(answered), 1),
        "most_ready": max((len(s.ready) for s in sampler.samples), default=0),
        "load_average": loads,
    }


def run_round(rep: int, args: argparse.Namespace, repo: Path, budget: int,
              rows: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every arm afresh, in this round's order: the open mix, then the closed loop."""
    models = tuple(sorted(p.name for p in repo.iterdir()))
    body = MLP.json_body(1)
    schedule = Mix(models, args.zipf, args.rate, args.duration, args.seed).schedule()
    order = [m for _, m in Mix(models, args.zipf, 1000.0, 10.0, args.seed + 1).schedule()]

    async def open_load(port: int, sampler: IndexSampler) -> list[Sent]:
        return await open_mix(port, schedule, wires(port, models, body), sampler)

    async def closed_load(port: int, sampler: IndexSampler) -> list[Sent]:
        requests = wires(port, models, body)
        return await closed_mix(
            port, order, requests, sampler, args.concurrency, args.closed_duration
        )

    starters = {
        "dlscale": lambda: dlscale_arm(
            repo, budget, args.out / f"dlscale-{rep}.log", shlex.split(args.dlscale_flags)
        ),
        "ray-serve": lambda: ray_arm(repo, args.max_models),
        "ray-serve-all": lambda: ray_arm(repo, len(models)),
    }
    arms = [a for a in ARMS if a in args.arms]
    shift = rep % len(arms)
    for name in arms[shift:] + arms[:shift]:
        with starters[name]() as arm:
            for bench, load in (("open", open_load), ("closed", closed_load)):
                record(rows, bench=bench, server=name, rep=rep, **measure(arm, load))


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paired ratios (dlscale over Ray, per round) and whether the target is met."""
    out: dict[str, Any] = {}
    for peer in [a for a in ARMS[1:] if any(r["server"] == a for r in rows)]:

        def ratio(key: str, bench: str, peer: str = peer) -> float | None:
            found = paired_ratios(rows, key, "dlscale", peer, bench=bench)
            return statistics.median(found) if found else None

        against = {
            "closed_throughput": ratio("throughput", "closed"),
            "open_p99": ratio("p99_s", "open"),
            "open_resident_p99": ratio("resident_p99_s", "open"),
            "open_cold_p99": ratio("cold_p99_s", "open"),
            "closed_p99": ratio("p99_s", "closed"),
            "cpu_per_answer_open": ratio("cpu_ms_per_answer", "open"),
            "cpu_per_answer_closed": ratio("cpu_ms_per_answer", "closed"),
        }
        throughput, p99 = against["closed_throughput"], against["open_p99"]
        against["met"] = bool((throughput or 0) >= 2.0 or (p99 is not None and p99 <= 0.5))
        out[peer] = against
    return out


COLUMNS = (
    ("throughput", "answered/s", 1.0),
    ("p50_s", "p50 ms", 1e3),
    ("p99_s", "p99 ms", 1e3),
    ("resident_p50_s", "resident p50", 1e3),
    ("resident_p99_s", "resident p99", 1e3),
    ("cold_p50_s", "cold p50", 1e3),
    ("cold_p99_s", "cold p99", 1e3),
    ("hit_rate", "hit rate", 1.0),
    ("loads", "loads", 1.0),
    ("mean_load_s", "mean load ms", 1e3),
    ("errors", "errors", 1.0),
    ("cpu_ms_per_answer", "CPU ms/answer", 1.0),
    ("most_ready", "most READY", 1.0),
)


def table(rows: list[dict[str, Any]]) -> str:
    """Medians over the rounds, one line per load and arm."""
    lines = ["| load | server | " + " | ".join(c[1] for c in COLUMNS) + " |"]
    lines.append("|" + "---|" * (len(COLUMNS) + 2))
    for bench in ("open", "closed"):
        for arm in ARMS:
            runs = [r for r in rows if r["bench"] == bench and r["server"] == arm]
            if not runs:
                continue
            cells = []
            for key, _, scale in COLUMNS:
                values = [r[key] * scale for r in runs if r.get(key) is not None]
                cells.append(f"{statistics.median(values):.3g}" if values else "")
            lines.append(f"| {bench} | {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--max-models", type=int, default=10, help="the budget, in models")
    parser.add_argument("--rate", type=float, default=30.0, help="open loop, requests/s")
    parser.add_argument("--duration", type=float, default=20.0, help="open loop, seconds")
    parser.add_argument("--closed-duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop streams")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--dlscale-flags", default="", help="more flags for dlscale serve")
    parser.add_argument("--out", type=Path, default=RESULTS / "multimodel-ray")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        repo, names = mlp_copies(Path(scratch), args.copies)
        budget = budget_for(repo, names, MLP.json_body(1), args.max_models, args.out / "probe.log")
        print(f"budget: cpu={budget} bytes ({budget / 2**20:.1f} MiB)", flush=True)
        for rep in range(args.rounds):
            run_round(rep, args, repo, budget, rows)
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
              "budget_bytes": budget, "rows": rows, "verdict": verdict(rows)}  # fmt: skip
    out = args.out / f"multimodel-ray-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n" + table(rows))
    print("\nratios, dlscale over each Ray Serve arm (median of the rounds' pairs):")
    print(json.dumps(result["verdict"], indent=1))
    print(out)


if __name__ == "__main__":
    main()
