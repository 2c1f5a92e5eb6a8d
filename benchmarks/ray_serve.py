"""Ray Serve against `dlscale serve` on one host, and replicas of a simulated device.

    python -m benchmarks.ray_serve [all|overhead|overhead-grpc|scaling] [--repeats 3]
                                   [--duration 5] [--scaling-duration 15]

overhead: identity and mlp (benchmarks/harness/models.py, the REST benchmark's files and knobs)
served by `dlscale serve` and by `dlscale serve --ray` (a Ray cluster started by the command,
one replica: a whole `dlscale serve` behind the fleet's HAProxy router), alternating within each
repetition, driven by the same closed-loop client (benchmarks/harness/clients.py) at
concurrency 1 and 32. overhead-grpc: the same over gRPC (raw bytes, one channel per stream:
benchmarks/harness/grpc_clients.py), against `dlscale serve` with its gRPC port and the fleet's
router's gRPC port (HTTP/2 through HAProxy). Ray Serve's own fast path (its HAProxy ingress)
was measured with the previous design; docs/decisions.md has its figures.

scaling: a null-backend model that sleeps 500 ms per batch of up to 8 rows, a stand-in for a
remote accelerator (the sleep holds no CPU), served by a Ray fleet of 1, 2, 4 and 8 replicas
in one Ray cluster on this machine, each driven by 16 closed-loop streams per replica. The same
model's profile is taken in process (`dlscale bench --repo`), and `dlscale plan serve --profile`
predicts each replica count's throughput from it (replicas = devices).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

import uvloop

from benchmarks.harness import models
from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.grpc_clients import grpc_closed_loop, infer_request
from benchmarks.harness.loads import rest_load
from benchmarks.harness.models import IDENTITY, MLP
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    free_port,
    start_dlscale,
    start_ray,
    start_rest_stack,
)
from benchmarks.harness.sleeper import SLEEPER, plan_one_device, scaling_table, sleeper_repository
from benchmarks.harness.statistics import machine, markdown, median_table, record

#: The simulated device: one batch of up to 8 rows takes this long, whatever its size. Slow
#: enough that 8 replicas (128 requests/s) reach the Ray path's ceiling on a 2-core machine.
DELAY_US = 500_000
REPLICAS = (1, 2, 4, 8)
STREAMS_PER_REPLICA = 16
#: The planner's p99 bound: 10 batch times, loose enough that its peak is near the capacity.
PLAN_P99 = "5s"
# -- overhead ----------------------------------------------------------------------------------


def run_overhead(repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """identity and mlp, JSON [1, N] per request, c=1 and c=32, each server in turn."""
    repo = WORK / "repo-ray-overhead"
    models.build_identity(repo)
    models.build_mlp(repo)
    for model in (IDENTITY, MLP):
        models.write_dlscale_config(repo, model)
    starters = {
        "dlscale": lambda: start_rest_stack(repo),
        "ray-serve": lambda: start_ray(repo),
    }
    order = list(starters)
    for rep in range(repeats):
        shift = rep % len(order)
        for name in order[shift:] + order[:shift]:
            server = starters[name]()
            try:
                for model in (IDENTITY, MLP):
                    for c in (1, 32):
                        r = rest_load(server, model, False, c, duration)
                        record(rows, bench="overhead", server=name, model=model.name,
                               concurrency=c, rep=rep, **r.summary())  # fmt: skip
            finally:
                server.stop()


def run_overhead_grpc(repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """identity and mlp over gRPC, [1, N] per request, c=1 and c=32, each server in turn."""
    repo = WORK / "repo-ray-overhead"
    models.build_identity(repo)
    models.build_mlp(repo)
    for model in (IDENTITY, MLP):
        models.write_dlscale_config(repo, model)

    def dlscale() -> tuple[ServerProcess, int]:
        server, _, grpc = start_dlscale(repo, [IDENTITY.name, MLP.name])
        return server, grpc

    def fleet() -> tuple[ServerProcess, int]:
        grpc = free_port()
        return start_ray(repo, grpc_port=grpc), grpc

    starters = {"dlscale": dlscale, "ray-serve": fleet}
    order = list(starters)
    for rep in range(repeats):
        for name in order[rep % 2 :] + order[: rep % 2]:
            server, port = starters[name]()
            try:
                for model in (IDENTITY, MLP):
                    request, _ = infer_request(model, 1)
                    for c in (1, 32):
                        r, _ = asyncio.run(
                            grpc_closed_loop(f"{HOST}:{port}", request, c, duration, 2.0)
                        )
                        record(rows, bench="overhead-grpc", server=name, model=model.name,
                               concurrency=c, rep=rep, **r.summary())  # fmt: skip
            finally:
                server.stop()


# -- scaling -----------------------------------------------------------------------------------


def run_scaling(repeats: int, duration: float, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """1, 2, 4, 8 replicas in one Ray cluster (scaled in place), 16 streams per replica."""
    import ray

    from dlscale.cli import parse
    from dlscale.scale import deploy
    from dlscale.scale.commands import deploy_fleet, settings_from

    repo = sleeper_repository("repo-ray-scaling", DELAY_US)
    per_replica, profile = plan_one_device(repo, PLAN_P99)
    port = free_port()
    settings = settings_from(parse([
        "serve", str(repo), "--ray", "--http-port", str(port), "--grpc-port", "-1",
        "--metrics-port", "-1", "--cpus-per-replica", "0", "--log-level", "warning",
    ]))  # fmt: skip
    ray.init(address="local", logging_level=logging.WARNING, include_dashboard=False)
    try:
        router = deploy_fleet(settings)
        body = SLEEPER.json_body()
        wire = build_request(HOST, port, f"/v2/models/{SLEEPER.name}/infer", body)
        for rep in range(repeats):
            for n in REPLICAS:
                deploy_fleet(dataclasses.replace(settings, replicas=n))
                streams = STREAMS_PER_REPLICA * n
                r = uvloop.run(closed_loop(HOST, port, wire, streams, duration, warmup_s=4.0))
                record(rows, bench="scaling", server="ray-serve", model=SLEEPER.name,
                       concurrency=streams, replicas=n, rep=rep, **r.summary())  # fmt: skip
        deploy.undeploy(router)
    finally:
        ray.shutdown()
    return {
        "profile": profile,
        "planned_per_replica": per_replica,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = ["all", "overhead", "overhead-grpc", "scaling"]
    parser.add_argument("which", nargs="?", default="all", choices=choices)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="overhead runs, seconds")
    parser.add_argument("--scaling-duration", type=float, default=15.0, help="seconds per run")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if args.which in ("all", "overhead"):
        run_overhead(args.repeats, args.duration, rows)
    if args.which in ("all", "overhead-grpc"):
        run_overhead_grpc(args.repeats, args.duration, rows)
    if args.which in ("all", "scaling"):
        extra = run_scaling(args.repeats, args.scaling_duration, rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"ray-serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, **extra}, indent=1))
    for bench in ("overhead", "overhead-grpc", "scaling"):
        table = median_table(rows, bench)
        if table:
            print(f"\n{bench}:\n{markdown(table)}")
    if extra:
        print(f"\nplanned per replica: {extra['planned_per_replica']:.1f} req/s")
        by_n: dict[int, list[float]] = {}
        for row in rows:
            if row["bench"] == "scaling":
                by_n.setdefault(row["replicas"], []).append(row["throughput"])
        print(scaling_table(by_n, extra["planned_per_replica"], "replicas"))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
