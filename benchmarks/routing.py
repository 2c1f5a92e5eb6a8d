"""Routing by work: two replicas of unequal speed, dlscale's router against Ray Serve's default.

    python -m benchmarks.routing [--repeats 3] [--duration 30] [--rate 70]
                                 [--fast-ms 50] [--slow-ms 150]

Two replicas of a null model on a simulated device, one taking `--fast-ms` per batch of up to 4
rows and the other three times as long (`--slow-ms`), driven by the same open-loop Poisson
arrivals (benchmarks/harness/open_loop.py, seeded: every arm gets the same schedule) of [1, 16]
FP32 JSON requests at `--rate` per second, about two thirds of the pair's capacity. Arms, in
turn within each repetition, each on fresh processes:
- dlscale-leastconn: HAProxy (scale/haproxy.py, `balance leastconn`) over two `dlscale serve`
  children (scale/child.py), weights equal;
- dlscale-weighted: the same, weighed every 2 s by scale/weights.py's Weigher from each
  replica's measured compute time per row, its batch and the fleet's load, and given each
  replica's batch clock, so that HAProxy sends each request where it would finish first
  (scale/finish.py), as the `--device-workers` supervisor does;
- dlscale-weighted-leastconn: the weights alone, no batch clocks (weighted leastconn: the rule
  before finish-first);
- dlscale-weighted-light: the weights alone, the Weigher's light-load weight at any load (its
  rule before the load counted);
- ray-serve-default: a plain Ray Serve application (no dlscale in the path,
  benchmarks/harness/ray_unequal.py), two replicas, the rank choosing the speed, called over
  Ray's HTTP proxy with its default router (power of two choices).
Each run reports p50/p99/throughput/errors, the CPU share of the proxy (HAProxy, or Ray's
ProxyActor: it must stay well below one core for the comparison to be about routing), the
share of requests the slow replica computed (dlscale arms) and the load average; for dlscale's
arms also HAProxy's log of each request, per replica: requests, queue time, p99, and the
replica the slowest 1% went to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import uvloop

from benchmarks.harness.clients import LoadResult, build_request
from benchmarks.harness.haproxy_log import breakdown, logged
from benchmarks.harness.models import BenchModel
from benchmarks.harness.open_loop import open_loop, poisson_schedule
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    ROOT,
    WORK,
    cpu_seconds,
    free_port,
    start_listening,
)
from benchmarks.harness.statistics import machine, median_of, paired_ratios, record
from dlscale.errors import DlscaleError
from dlscale.scale.child import ServerChild
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.weights import Weigher, read_work
from dlscale.server import ServerSettings

SLEEPER = BenchModel("sleeper", "input", "output", (16,), 4, 0)
ARMS = (
    "dlscale-leastconn",
    "dlscale-weighted",
    "dlscale-weighted-leastconn",
    "dlscale-weighted-light",
    "ray-serve-default",
    "ray-serve-uncapped",
)
#: ray-serve-uncapped: requests a replica may hold, high enough that Ray's cap never binds.
UNCAPPED = 64
#: Seconds between two weighings, as the `--device-workers` supervisor (scale/local_fleet.py).
WEIGH_S = 2.0
WARMUP_S = 6.0
SEED = 35


@contextmanager
def dlscale_fleet(
    delays_ms: tuple[float, float], weighted: bool, follow_load: bool = True, timed: bool = True
) -> Iterator[dict[str, Any]]:
    """Two `dlscale serve` children behind HAProxy; `weighted`: weighed every WEIGH_S (by the
    Weigher's light-load rule alone without `follow_load`) and, if `timed`, given their batch
    clocks (finish-first routing). HAProxy logs each request (harness/haproxy_log.py): which
    replica took it, how long it queued."""
    children = [ServerChild(_settings(_sleeper_repo(ms))) for ms in delays_ms]
    router = HaproxyRouter(HOST, 0, None)
    stop = threading.Event()
    weigher = Weigher(follow_load)
    chosen: dict[str, int] = {}
    try:
        ends = [child.start() for child in children]
        with logged() as log:
            router.start()
            members = [Member(f"r{i}", e.host, e.http_port) for i, e in enumerate(ends)]
            router.sync(members)
            _until(lambda: set(router.states().values()) == {"UP"})
            if weighted:
                weighing = (router, weigher, members, chosen, stop, timed)
                threading.Thread(target=_weigh, args=weighing).start()
            yield {
                "port": router.ports["http"],
                "proxy_pid": _haproxy_pid(),
                "rows": lambda: [read_work(m.host, m.http_port).rows for m in members],
                "log": log,
                # HAProxy's servers are the slots: r1 holds member r0 (fast), r2 r1 (slow).
                "names": {"r1": "fast", "r2": "slow"},
                "weights": lambda: {
                    "ms_per_row": {k: round(v / 1e6, 1) for k, v in weigher.ns_per_row.items()},
                    "weights": dict(chosen),
                    "clocks": dict(router.clocks),
                    "load": round(weigher.load, 3),
                },
            }
    finally:
        stop.set()
        router.stop()
        for child in children:
            child.stop(5.0)


def _weigh(
    router: HaproxyRouter,
    weigher: Weigher,
    members: list[Member],
    chosen: dict[str, int],
    stop: threading.Event,
    timed: bool,
) -> None:
    """The `--device-workers` supervisor's loop (scale/local_fleet.py); `chosen`: the last."""
    while not stop.wait(WEIGH_S):
        try:
            chosen.update(weigher.weights({m.key: read_work(m.host, m.http_port) for m in members}))
            router.weigh(chosen, weigher.clocks() if timed else None)
        except (OSError, DlscaleError):  # the arm ended under it: the router or a replica left
            continue


def _settings(repo: Path) -> ServerSettings:
    return ServerSettings.build(
        repo, host=HOST, http_port=0, grpc_port=None, metrics_port=None, log_level="warning"
    )


def _sleeper_repo(delay_ms: float) -> Path:
    """A null model holding its simulated device `delay_ms` per batch of up to 4 rows."""
    repo = WORK / f"repo-routing-{delay_ms:g}ms"
    folder = repo / SLEEPER.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.null").touch()
    (folder / "config.toml").write_text(
        f'backend = "null"\nmax_batch_size = {SLEEPER.max_batch_size}\n'
        "[batching]\nmax_queue_delay_us = 0\n"
        f"[backend_options]\ndelay_us = {round(delay_ms * 1000)}\n"
        'simulated_device = "device"\n'
        '[[inputs]]\nname = "input"\ndatatype = "FP32"\nshape = [16]\n'
        '[[outputs]]\nname = "output"\ndatatype = "FP32"\nshape = [16]\n'
    )
    return repo


def _haproxy_pid() -> int:
    found = [p.pid for p in psutil.Process().children() if p.name() == "haproxy"]
    assert len(found) == 1, found
    return int(found[0])


def _until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the router's replicas did not come up")
        time.sleep(0.1)


@contextmanager
def ray_app(delays_ms: tuple[float, float], uncapped: bool) -> Iterator[dict[str, Any]]:
    """The plain Ray Serve application (harness/ray_unequal.py) in a process of its own."""
    argv = ["-m", "benchmarks.harness.ray_unequal", "--port", str(free_port()),
            "--fast-ms", str(delays_ms[0]), "--slow-ms", str(delays_ms[1])]  # fmt: skip
    argv += ["--max-ongoing", str(UNCAPPED)] if uncapped else []
    # Ray's worker processes import the deployment's module: the checkout's root on their path.
    server = start_listening("ray-serve-default", argv, PYTHONPATH=str(ROOT))
    try:
        yield {"port": server.port, "proxy_pid": _ray_proxy_pid(server.proc.pid)}
    finally:
        server.stop()


def _ray_proxy_pid(root: int) -> int:
    for proc in psutil.Process(root).children(recursive=True):
        if "ProxyActor" in " ".join(proc.cmdline()):
            return int(proc.pid)
    raise RuntimeError("no Ray Serve ProxyActor process found")


def run_arm(arm: str, delays: tuple[float, float], schedule: list[float]) -> dict[str, Any]:
    """One arm on fresh processes: the schedule's load, what it measured, the proxy's CPU."""
    if arm.startswith("ray"):
        fleet = ray_app(delays, uncapped=arm.endswith("uncapped"))
    else:
        light, counts = arm.endswith("light"), arm.endswith("leastconn") and "weighted" in arm
        fleet = dlscale_fleet(delays, "weighted" in arm, not light, not (light or counts))
    with fleet as served:
        port = served["port"]
        wire = build_request(HOST, port, f"/v2/models/{SLEEPER.name}/infer", SLEEPER.json_body())
        rows = served.get("rows", lambda: [0, 0])
        before_rows, before_cpu, t0 = rows(), cpu_seconds(served["proxy_pid"]), time.monotonic()
        result: LoadResult = uvloop.run(open_loop(HOST, port, wire, schedule, WARMUP_S))
        cpu = (cpu_seconds(served["proxy_pid"]) - before_cpu) / (time.monotonic() - t0)
        served_rows = [a - b for a, b in zip(rows(), before_rows, strict=True)]
        extra = served["weights"]() if "weights" in served else {}
        if "log" in served:  # the measured requests: those after the warm-up's
            warm = sum(t < WARMUP_S for t in schedule)
            extra["haproxy"] = breakdown(served["log"].since(warm), served["names"])
    if result.errors:
        print(f"  {arm}: {result.errors} errors, first: {result.first_error}", flush=True)
    slow_share = served_rows[1] / sum(served_rows) if sum(served_rows) else None
    return {**result.summary(), "proxy_cpu": round(cpu, 3), "slow_share": slow_share,
            "load_avg_1m": round(os.getloadavg()[0], 2), **extra}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """Medians per arm over the repetitions, as a markdown table; per replica (HAProxy's log,
    dlscale's arms) its p99 and the share of the slowest 1% of requests it took."""
    head = (
        "| arm | runs | p50 (ms) | p99 (ms) | throughput (req/s) | errors | slow share | proxy CPU"
        " | fast p99 | slow p99 | tail on slow"
    )
    lines = [head + " |", "|---" * 11 + "|"]
    for arm in ARMS:
        runs = [r for r in rows if r["server"] == arm]
        if not runs:
            continue
        med = {k: median_of(rows, k, server=arm) for k in ("p50_ms", "p99_ms", "throughput")}
        shares = [r["slow_share"] for r in runs if r["slow_share"] is not None]
        share = f"{statistics.median(shares):.2f}" if shares else "n/a"
        lines.append(
            f"| {arm} | {len(runs)} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} | "
            f"{med['throughput']:.1f} | {sum(r['errors'] for r in runs)} | {share} | "
            f"{median_of(rows, 'proxy_cpu', server=arm):.2f} | {_per_replica(runs)} |"
        )
    return "\n".join(lines)


def _per_replica(runs: list[dict[str, Any]]) -> str:
    """The fast and slow replicas' p99 and the slow one's share of the tail: medians."""
    logs = [r["haproxy"]["servers"] for r in runs if r.get("haproxy", {}).get("servers")]
    if not logs:
        return "n/a | n/a | n/a"

    def med(name: str, key: str) -> float:
        return statistics.median(log.get(name, {}).get(key, 0.0) for log in logs)

    fast, slow = med("fast", "p99_ms"), med("slow", "p99_ms")
    return f"{fast:.0f} | {slow:.0f} | {med('slow', 'tail_share'):.2f}"


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median over repetitions of the paired p99 ratios the target names."""
    pairs = {
        "ray_default_over_weighted": ("ray-serve-default", "dlscale-weighted"),
        "leastconn_over_weighted": ("dlscale-leastconn", "dlscale-weighted"),
        "ray_uncapped_over_weighted": ("ray-serve-uncapped", "dlscale-weighted"),
        "weighted_leastconn_over_weighted": ("dlscale-weighted-leastconn", "dlscale-weighted"),
        "light_over_weighted": ("dlscale-weighted-light", "dlscale-weighted"),
        "ray_default_over_leastconn": ("ray-serve-default", "dlscale-leastconn"),
    }
    found = {}
    for name, (a, b) in pairs.items():
        paired = paired_ratios(rows, "p99_ms", a, b)
        if paired:
            found[name] = round(statistics.median(paired), 2)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    parser.add_argument("--rate", type=float, default=70.0, help="requests per second")
    parser.add_argument("--fast-ms", type=float, default=50.0, help="fast replica, per batch")
    parser.add_argument("--slow-ms", type=float, default=150.0, help="slow replica, per batch")
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args()
    delays = (args.fast_ms, args.slow_ms)
    capacity = SLEEPER.max_batch_size * sum(1e3 / ms for ms in delays)
    print(f"rate {args.rate:g}/s, {args.rate / capacity:.0%} of the pair's {capacity:.1f}/s")
    schedule = poisson_schedule(args.rate, WARMUP_S + args.duration, SEED)
    arms = args.arms.split(",")
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        shift = rep % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            record(
                rows,
                bench="routing",
                server=arm,
                rep=rep,
                **run_arm(arm, delays, schedule),
            )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"routing-{time.strftime('%Y%m%d-%H%M%S')}.json"
    found = ratios(rows)
    settings = {**vars(args), "capacity": capacity, "warmup_s": WARMUP_S, "seed": SEED}
    out.write_text(json.dumps({"machine": machine(), "settings": settings, "rows": rows,
                               "ratios": found}, indent=1))  # fmt: skip
    print(f"\n{table(rows)}\n\np99 ratios (paired, median): {found}\nresults: {out}")


if __name__ == "__main__":
    main()
