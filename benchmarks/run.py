"""Run the REST benchmarks of BENCHMARKS.md: HTTP stacks, and dlscale against Seldon MLServer.

    python -m benchmarks.run [all|rest|stacks|peers|inprocess|plan] [--repeats 3] [--duration 5]

Every server runs in its own process with OMP/OPENBLAS/MKL threads at 1 and is driven by the same
closed-loop client (benchmarks/harness/clients.py) from this process. Servers alternate within a
run;
the tables give medians over the repetitions. Results also go to bench-results/*.json.
`all` (what `make bench` runs) starts with `plan` (benchmarks/plan_validation.py) and ends with
the gRPC benchmarks of benchmarks/serve_grpc.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import models, peers
from benchmarks.harness.loads import inprocess_throughput, rest_load
from benchmarks.harness.models import IDENTITY, MLP, RESNET50
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    free_port,
    run_script,
    start_mlserver,
    start_rest_stack,
)
from benchmarks.harness.statistics import machine, markdown, median_table, paired_ratios, record

# -- the runs --------------------------------------------------------------------------------------


def run_stacks(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """dlscale's REST routes on each candidate HTTP stack, identity JSON [1,16], c=1 and c=32.

    `protocol` is dlscale's own transport on uvloop; `protocol-asyncio` the same on asyncio's loop.
    The model has no queue delay here, so that the figures are the HTTP stack's alone.
    """
    repo = WORK / "repo-stacks"
    models.build_identity(repo)
    models.write_dlscale_config(repo, dataclasses.replace(IDENTITY, max_queue_delay_us=0))
    stacks = ["protocol", "protocol-asyncio", "uvicorn", "granian"]
    for rep in range(repeats):
        shift = rep % len(stacks)
        for stack in stacks[shift:] + stacks[:shift]:
            server = start_rest_stack(repo, stack)
            try:
                for c in (1, 32):
                    r = rest_load(server, IDENTITY, False, c, duration)
                    record(
                        rows,
                        bench="stacks",
                        server=server.name,
                        model="identity",
                        concurrency=c,
                        rep=rep,
                        **r.summary(),
                    )
            finally:
                server.stop()


def run_peers(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """dlscale against MLServer: identity FP32 [1,16] as JSON at c=1 and c=32, alternating."""
    port = free_port()
    folder = peers.mlserver_repository(
        WORK / "mlserver-repo", repo, [IDENTITY], port, free_port(), free_port()
    )
    starters: dict[str, Callable[[], ServerProcess]] = {
        "dlscale": lambda: start_rest_stack(repo),
        "mlserver": lambda: start_mlserver(folder, port, [IDENTITY.name]),
    }
    order = list(starters)
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            server = starters[name]()
            try:
                for c in (1, 32):
                    r = rest_load(server, IDENTITY, False, c, duration)
                    record(
                        rows,
                        bench="peers",
                        server=name,
                        model="identity",
                        concurrency=c,
                        rep=rep,
                        **r.summary(),
                    )
            finally:
                server.stop()


def _served_batch(server: ServerProcess, model: str) -> float:
    with urllib.request.urlopen(f"http://{HOST}:{server.port}/v2/models/{model}/stats") as r:
        stats = json.load(r)["model_stats"][0]
    return float(stats["inference_count"] / max(stats["execution_count"], 1))


def run_inprocess(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """Served with binary tensors, one row per request at c = max_batch_size, against a bare
    onnxruntime session at that batch size: mlp always, resnet50 when the zoo can build it."""
    chosen = [MLP]
    if models.build_resnet50(repo):
        models.write_dlscale_config(repo, RESNET50)
        chosen.append(RESNET50)
    else:
        print("resnet50 skipped: dlscale's zoo (and torch, which builds it) is not installed")
    for model in chosen:
        concurrency = model.max_batch_size
        seconds = duration if model is RESNET50 else duration / 4
        for rep in range(repeats):
            server = start_rest_stack(repo)
            try:
                r = rest_load(server, model, True, concurrency, seconds)
                batch = _served_batch(server, model.name)
                record(
                    rows,
                    bench="inprocess",
                    server="dlscale",
                    model=model.name,
                    concurrency=concurrency,
                    rep=rep,
                    mean_batch=round(batch, 2),
                    **r.summary(),
                )
            finally:
                server.stop()
            # At the batch size the server really ran (one instance under a closed loop often
            # alternates two half-full batches) and at batch = concurrency, for reference.
            sizes = {"served-batch": max(1, round(batch)), "batch-eq-c": concurrency}
            measured: dict[int, float] = {}
            for label, size in sizes.items():
                if size not in measured:
                    measured[size] = inprocess_throughput(model.path(repo), model, size, seconds)
                record(
                    rows,
                    bench="inprocess",
                    server=f"onnxruntime-inprocess-{label}",
                    model=model.name,
                    concurrency=concurrency,
                    rep=rep,
                    batch=size,
                    throughput=round(measured[size], 2),
                )


# -- reporting -------------------------------------------------------------------------------------


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The targets of BENCHMARKS.md as ratios of medians."""
    out: dict[str, float] = {}
    peers_table = {(r["server"], r["concurrency"]): r for r in median_table(rows, "peers")}
    ours, theirs = peers_table.get(("dlscale", 32)), peers_table.get(("mlserver", 32))
    if ours and theirs:
        out["identity_c32_throughput_vs_mlserver"] = round(
            ours["throughput"] / theirs["throughput"], 2
        )
        out["identity_c32_p99_vs_mlserver"] = round(ours["p99_ms"] / theirs["p99_ms"], 2)
    served = {(r["server"], r["model"]): r for r in median_table(rows, "inprocess")}
    for model in ("mlp", "resnet50"):
        ours = served.get(("dlscale", model))
        for label in ("served-batch", "batch-eq-c"):
            ref = served.get((f"onnxruntime-inprocess-{label}", model))
            if ours and ref:
                key = f"{model}_served_vs_inprocess_{label}"
                out[key] = round(ours["throughput"] / ref["throughput"], 3)
        # Served and in-process run back to back in each repetition: the median of the paired
        # ratios cancels the machine's slow drifts better than the ratio of medians.
        paired = _paired(rows, model, "onnxruntime-inprocess-served-batch")
        if paired:
            out[f"{model}_served_vs_inprocess_served-batch_paired"] = round(
                statistics.median(paired), 3
            )
    return out


def _paired(rows: list[dict[str, Any]], model: str, reference: str) -> list[float]:
    """Per repetition: served throughput over the reference's, measured right after it."""
    return paired_ratios(rows, "throughput", "dlscale", reference, bench="inprocess", model=model)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `make bench`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=("all", "rest", "stacks", "peers", "inprocess", "plan"),
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--resnet-duration", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.which in ("all", "plan"):  # the planner against a measured peak (plan_validation.py)
        run_script("plan_validation", ["--repeats", str(args.repeats)])
        if args.which == "plan":
            return 0
    repo = WORK / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    for model, build in ((IDENTITY, models.build_identity), (MLP, models.build_mlp)):
        build(repo)
        models.write_dlscale_config(repo, model)
    rows: list[dict[str, Any]] = []
    info = machine()
    print(json.dumps(info), flush=True)
    if args.which in ("all", "stacks"):
        run_stacks(repo, args.repeats, args.duration, rows)
    if args.which in ("all", "rest", "peers"):
        peers.ensure_mlserver()
        info["mlserver"] = peers.mlserver_version()
        run_peers(repo, args.repeats, args.duration, rows)
    if args.which in ("all", "rest", "inprocess"):
        run_inprocess(repo, args.repeats, args.resnet_duration, rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"rest-{args.which}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    summary = ratios(rows)
    report = {"machine": info, "args": vars(args), "rows": rows, "ratios": summary}
    out.write_text(json.dumps(report, indent=1))
    for bench in ("stacks", "peers", "inprocess"):
        table = median_table(rows, bench)
        if table:
            print(f"\n## {bench} (medians of {args.repeats})\n\n{markdown(table)}")
    print(f"\nratios: {json.dumps(summary)}\nraw results: {out}")
    if args.which == "all":
        argv = ["all", "--repeats", str(args.repeats), "--duration", str(args.duration)]
        code = run_script("serve_grpc", [*argv, "--resnet-duration", str(args.resnet_duration)])
        run_script("optimize_cpu", ["--repeats", str(args.repeats)])
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
