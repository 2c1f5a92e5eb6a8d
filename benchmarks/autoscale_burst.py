"""Autoscaling on a burst: dlscale's objective policy against a static fleet and Ray's default.

    python -m benchmarks.autoscale_burst [--rate 4] [--factor 5] [--before 30] [--burst 60]
                                         [--after 150] [--objective-ms 1000] [--delay-ms 100]

A simulated device (a null model that holds its device `--delay-ms` per batch of up to 2 rows:
the sleep holds no CPU, so replicas cost sleep on this 2-core host, not CPU) served by a fleet
on one local Ray cluster started here (the code path of `dlscale serve --ray`: the flags below
are parsed by dlscale's own command line), and driven by `dlscale bench URL --shape burst`
(bench/replay_run.py: an open loop, the same seeded schedule for every arm: baseline `--rate`,
`--factor` times it for `--burst` s, baseline again) with `--fleet-metrics` (the replica count
each second). Three arms, one after the other in the same run and cluster:
- static: `--replicas N`, N from `dlscale plan serve` at the shape's mean rate and the objective
  (a profile of one replica taken in process first);
- ray-default: `--autoscale 1:MAX` on a model without an objective: the target-ongoing-requests
  rule of Ray Serve's default policy (a replica per `target_ongoing_requests` in flight; the
  target is a full batch per instance), fed with the servers' own in-flight counts, since
  requests bypass Ray's proxies and Ray's own count is zero (docs/scale.md);
- objective: `--autoscale 1:MAX` on the same model with `[qos] latency_objective_us`
  (scale/objective.py: queue wait against the objective).
Every arm serves the same model with a `[qos]` table (empty of an objective for ray-default), so
the servers schedule alike and only the policy differs. Reported: goodput (answers within the
objective) per second and per replica-second, its ratio to static, requests that failed while
the fleet scaled down, the replica count at the burst's end and the run's end against the plan
at those rates, the load average, and one plot with the arms side by side.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness.servers import HOST, RESULTS, WORK, dlscale_exe, thread_env
from benchmarks.harness.statistics import machine
from dlscale.bench.replay_plot import plot_runs

MODEL = "sleeper"
ARMS = ("static", "ray-default", "objective")
MAX_BATCH = 2
#: Seconds either side of a scale-down in which a failed request counts as lost to it.
DOWN_WINDOW_S = 10.0


def repository(name: str, delay_us: int, objective_us: int) -> Path:
    """WORK/NAME: the sleeper, `delay_us` per batch of up to MAX_BATCH rows, with a [qos] table
    (the objective when `objective_us` > 0)."""
    repo = WORK / name
    folder = repo / MODEL
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.null").touch()
    qos = f"latency_objective_us = {objective_us}\n" if objective_us else "weight = 1.0\n"
    (folder / "config.toml").write_text(
        f'backend = "null"\nmax_batch_size = {MAX_BATCH}\n'
        "[batching]\nmax_queue_delay_us = 0\n"
        f"[backend_options]\ndelay_us = {delay_us}\n[qos]\n{qos}"
        '[[inputs]]\nname = "input"\ndatatype = "FP32"\nshape = [16]\n'
        '[[outputs]]\nname = "output"\ndatatype = "FP32"\nshape = [16]\n'
    )
    return repo


def profile(repo: Path) -> Path:
    """One replica's batch times, measured in process (`dlscale bench --repo`)."""
    out = WORK / f"{repo.name}-profile"
    subprocess.run(
        [dlscale_exe(), "bench", "--repo", str(repo), "--model", MODEL, "--scenario", "offline",
         "--duration", "10s", "--out", str(out), "--no-progress"],
        check=True, stdout=subprocess.DEVNULL, env=thread_env(),
    )  # fmt: skip
    return out / "report.json"


def planned(report: Path, rate: float, objective_ms: float) -> int:
    """`dlscale plan serve --profile`: replicas (devices) for `rate` within the objective."""
    out = WORK / f"autoscale-plan-{rate:g}.json"
    subprocess.run(
        [dlscale_exe(), "plan", "serve", "--profile", str(report), "--qps", f"{rate:g}",
         "--p99", f"{objective_ms:g}ms", "--devices", "CPU", "--max-batch", str(MAX_BATCH),
         "--flops-per-sample", "1", "--bytes-per-sample", "1", "--json", str(out)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    devices = json.loads(out.read_text())[0]["devices"]
    if devices is None:
        raise SystemExit(f"plan serve: no replica count holds {objective_ms} ms at {rate}/s")
    return int(devices)


def deploy(repo: Path, scaling: list[str]) -> tuple[Any, int, int]:
    """The fleet, as `dlscale serve REPO --ray ...scaling` deploys it; router, REST and metrics
    ports, once the model answers ready through the router."""
    import ray

    from dlscale.cli import parse
    from dlscale.scale.commands import deploy_fleet, settings_from

    # Ports 0: the router binds what the OS gives (a port probed free may be taken meanwhile
    # on a host shared with other runs), then says which.
    settings = settings_from(parse([
        "serve", str(repo), "--ray", "--http-port", "0", "--grpc-port", "-1",
        "--metrics-port", "0", "--cpus-per-replica", "0", "--log-level", "warning",
        # Every request reaches a replica from HAProxy's one address, and so does the replica's
        # own health check: under the default per-peer cap (256) an overloaded replica answers
        # its check 503 and Ray replaces it, dropping its queue. No cap: it queues, as a
        # device would.
        "--max-connections-per-peer", "0", *scaling,
    ]))  # fmt: skip
    router = deploy_fleet(settings)
    ports = ray.get(router.ports.remote(), timeout=30)  # type: ignore[attr-defined]
    http, metrics = ports["http"], ports["metrics"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            url = f"http://{HOST}:{http}/v2/models/{MODEL}/ready"
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return router, http, metrics
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the fleet did not become ready in 120 s")


def replay(arm: str, http: int, metrics: int, shape: list[str], out: Path) -> dict[str, Any]:
    """`dlscale bench` replaying the burst shape against the fleet; its report."""
    subprocess.run(
        [dlscale_exe(), "bench", f"http://{HOST}:{http}", "--model", MODEL, "--shape", "burst",
         *shape, "--fleet-metrics", f"http://{HOST}:{metrics}", "--out", str(out / arm),
         "--no-progress"],
        check=True, env=thread_env(),
    )  # fmt: skip
    report: dict[str, Any] = json.loads((out / arm / "report.json").read_text())
    return report


def lost_scaling_down(report: dict[str, Any]) -> int:
    """Failed requests sent within DOWN_WINDOW_S of a scale-down."""
    downs = [e["t_s"] for e in report["scaling_events"] if e["to"] < e["from"]]
    failed = [row for row in report["timeline"] if row["errors"]]
    return sum(
        row["errors"] for row in failed if any(abs(row["t_s"] - t) <= DOWN_WINDOW_S for t in downs)
    )


def replicas_at(report: dict[str, Any], t: float) -> int | None:
    """The replicas serving at `t` seconds (the last sample at or before it)."""
    seen = [s["replicas"] for s in report["fleet_samples"] if s["t_s"] <= t]
    return seen[-1] if seen else None


def row(arm: str, report: dict[str, Any], args: argparse.Namespace, load: list[float]) -> dict:
    """One arm's line of the table."""
    g = report["goodput"]
    burst_end = args.before + args.burst
    return {
        "arm": arm,
        "sent": g["sent"],
        "within_objective": g["within_objective"],
        "goodput_per_s": g["goodput_per_s"],
        "replica_seconds": g["replica_seconds"],
        "goodput_per_replica_s": g["goodput_per_replica_s"],
        "errors": report["errors"],
        "lost_scaling_down": lost_scaling_down(report),
        "scale_events": len(report["scaling_events"]),
        "replicas_burst_end": replicas_at(report, burst_end - 1),
        "replicas_run_end": replicas_at(report, 1e9),
        "p99_s": {t: v["latency_s"]["p99"] for t, v in report["tenants"].items()},
        "load_average": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=4.0, help="baseline requests/s")
    parser.add_argument("--factor", type=float, default=5.0, help="the burst over the baseline")
    parser.add_argument("--before", type=float, default=30.0, help="baseline before, seconds")
    parser.add_argument("--burst", type=float, default=60.0, help="the burst, seconds")
    parser.add_argument("--after", type=float, default=150.0, help="baseline after, seconds")
    parser.add_argument("--objective-ms", type=float, default=1000.0)
    parser.add_argument("--delay-ms", type=float, default=100.0, help="per batch of up to 2")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, in this order")
    args = parser.parse_args()
    run(args)


def run(args: argparse.Namespace) -> None:
    import ray

    objective_us = int(args.objective_ms * 1000)
    with_objective = repository("repo-autoscale-objective", int(args.delay_ms * 1000), objective_us)
    without = repository("repo-autoscale-plain", int(args.delay_ms * 1000), 0)
    duration = args.before + args.burst + args.after
    mean = args.rate * (args.before + args.after + args.factor * args.burst) / duration
    report_path = profile(with_objective)
    plan = {
        "mean": planned(report_path, mean, args.objective_ms),
        "baseline": planned(report_path, args.rate, args.objective_ms),
        "burst": planned(report_path, args.rate * args.factor, args.objective_ms),
    }
    most = max(4, plan["burst"] + 1)
    arms = {
        "static": (with_objective, ["--replicas", str(plan["mean"])]),
        "ray-default": (without, ["--autoscale", f"1:{most}"]),
        "objective": (with_objective, ["--autoscale", f"1:{most}"]),
    }
    shape = ["--baseline-rate", f"{args.rate:g}", "--burst-factor", f"{args.factor:g}",
             "--before", f"{args.before:g}s", "--burst", f"{args.burst:g}s",
             "--after", f"{args.after:g}s",
             "--latency-bound", f"{args.objective_ms:g}ms"]  # fmt: skip
    out = RESULTS / f"autoscale-burst-{time.strftime('%Y%m%d-%H%M%S')}"
    reports: dict[str, dict[str, Any]] = {}
    rows = []
    # "local": a cluster of this run's own. Without an address ray.init joins the cluster
    # that the latest `ray start` on this host recorded (/tmp/ray/ray_current_cluster), which
    # may be someone else's; its fleet would be replaced by this one.
    ray.init(address="local", logging_level=logging.WARNING, include_dashboard=False)
    try:
        from dlscale.scale.deploy import undeploy

        for arm in args.arms.split(","):
            repo, scaling = arms[arm]
            router, http, metrics = deploy(repo, scaling)
            try:
                before = os.getloadavg()[0]
                reports[arm] = replay(arm, http, metrics, shape, out)
                rows.append(row(arm, reports[arm], args, [before, os.getloadavg()[0]]))
            finally:
                undeploy(router)
                time.sleep(3)
    finally:
        ray.shutdown()
    summarize(args, plan, mean, rows, reports, out)


def summarize(
    args: argparse.Namespace,
    plan: dict[str, int],
    mean: float,
    rows: list[dict[str, Any]],
    reports: dict[str, dict[str, Any]],
    out: Path,
) -> None:
    """The table, the ratios against static and ray-default, the plot, the JSON."""
    by_arm = {r["arm"]: r for r in rows}
    for r in rows:
        for base in ("static", "ray-default"):
            ours, theirs = (
                r["goodput_per_replica_s"],
                by_arm.get(base, {}).get("goodput_per_replica_s"),
            )
            r[f"over_{base}"] = ours / theirs if ours and theirs else None
    plot_runs(reports, out / "arms.png")
    summary = {"machine": machine(), "args": vars(args), "plan": plan, "mean_rate": mean,
               "rows": rows, "plot": str(out / "arms.png")}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"plan serve: {plan} replicas (mean rate {mean:.1f}/s)")
    print(
        "| arm | sent | good | good/s | replica-s | good/replica-s | x static | x ray-default "
        "| errors | lost scaling down | replicas at burst end / run end | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['arm']} | {r['sent']} | {r['within_objective']} | {r['goodput_per_s']:.2f} | "
            f"{r['replica_seconds']:.0f} | {r['goodput_per_replica_s']:.3f} | "
            f"{_ratio(r['over_static'])} | {_ratio(r['over_ray-default'])} | "
            f"{sum(r['errors'].values())} | {r['lost_scaling_down']} | "
            f"{r['replicas_burst_end']} / {r['replicas_run_end']} | "
            f"{r['load_average'][0]:.1f}-{r['load_average'][1]:.1f} |"
        )
    print(f"\nresults: {out / 'summary.json'}, plot: {out / 'arms.png'}")


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


if __name__ == "__main__":
    main()
