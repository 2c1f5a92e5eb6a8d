"""dlscale over gRPC in its own process, and the gRPC benchmarks of BENCHMARKS.md.

    python -m benchmarks.serve_grpc serve REPO [--port 0]     # prints LISTENING <port>
    python -m benchmarks.serve_grpc [all|peers|resnet] [--repeats 3] [--duration 5]

The benchmarks drive dlscale and Seldon MLServer over gRPC with the same client
(benchmarks/harness/grpc_clients.py): `identity` FP32 [1,16] as raw contents at concurrency 1 and
32,
servers alternating within each repetition; and `resnet50` as raw contents at concurrency 16
against in-process ONNX Runtime at batch 16. The tables give medians over the repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import models, peers
from benchmarks.harness.clients import LoadResult
from benchmarks.harness.grpc_clients import decode_output, grpc_closed_loop, infer_request
from benchmarks.harness.loads import inprocess_throughput
from benchmarks.harness.models import IDENTITY, RESNET50, BenchModel
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    announce,
    free_port,
    start_listening,
    start_mlserver,
)
from benchmarks.harness.statistics import machine, markdown, median_table, record

# -- the server process ----------------------------------------------------------------------


async def serve(repo: Path, port: int) -> None:
    """Serve every model over gRPC on `port` as `dlscale serve` does; stop on a signal."""
    from dlscale.server import Server, ServerSettings

    settings = ServerSettings.build(
        repo, host=HOST, http_port=None, grpc_port=port, metrics_port=None, grace_s=5.0
    )
    await Server(settings).serve_forever(on_ready=lambda server: announce(server.ports["grpc"]))


def start_dlscale_grpc(repo: Path) -> ServerProcess:
    """dlscale's gRPC server in a process of its own."""
    return start_listening("dlscale", ["-m", "benchmarks.serve_grpc", "serve", str(repo)])


# -- the runs ----------------------------------------------------------------------------------


def load(
    name: str, grpc_port: int, model: BenchModel, concurrency: int, duration: float
) -> LoadResult:
    """One closed-loop run; the first answer is checked against the model's expected output."""
    request, x = infer_request(model)
    result, first = asyncio.run(
        grpc_closed_loop(
            f"{HOST}:{grpc_port}", request, concurrency, duration, min(2.0, duration / 2)
        )
    )
    if result.errors:
        print(f"  {name}: {result.errors} errors, first: {result.first_error}", flush=True)
    if first:
        y = decode_output(first, model.output_name)
        if model is IDENTITY and not np.array_equal(y, x):
            raise RuntimeError(f"{name} answered identity with other values")
    return result


def run_peers(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """dlscale against MLServer over gRPC: identity [1,16] raw at c=1 and c=32, alternating."""
    http_port, grpc_port = free_port(), free_port()
    folder = peers.mlserver_repository(
        WORK / "mlserver-grpc-repo", repo, [IDENTITY], http_port, grpc_port, free_port()
    )
    starters: dict[str, Callable[[], tuple[ServerProcess, int]]] = {
        "dlscale": lambda: _with_port(start_dlscale_grpc(repo)),
        "mlserver": lambda: (start_mlserver(folder, http_port, [IDENTITY.name]), grpc_port),
    }
    order = list(starters)
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            server, port = starters[name]()
            try:
                for c in (1, 32):
                    r = load(name, port, IDENTITY, c, duration)
                    record(rows, bench="grpc-peers", server=name, model="identity",
                            concurrency=c, rep=rep, **r.summary())  # fmt: skip
            finally:
                server.stop()


def _with_port(server: ServerProcess) -> tuple[ServerProcess, int]:
    return server, server.port


def run_resnet(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """resnet50 as raw contents at c=16 over gRPC, against in-process onnxruntime at batch 16."""
    if not models.build_resnet50(repo):
        print("resnet50 skipped: dlscale's zoo (and torch, which builds it) is not installed")
        return
    models.write_dlscale_config(repo, RESNET50)
    concurrency = RESNET50.max_batch_size
    for rep in range(repeats):
        server = start_dlscale_grpc(repo)
        try:
            r = load("dlscale", server.port, RESNET50, concurrency, duration)
            record(rows, bench="grpc-resnet", server="dlscale", model="resnet50",
                    concurrency=concurrency, rep=rep, **r.summary())  # fmt: skip
        finally:
            server.stop()
        ips = inprocess_throughput(RESNET50.path(repo), RESNET50, concurrency, duration)
        record(rows, bench="grpc-resnet", server="onnxruntime-inprocess", model="resnet50",
                concurrency=concurrency, rep=rep, throughput=round(ips, 2))  # fmt: skip


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The targets of the gRPC issue, from the medians."""
    out: dict[str, float] = {}
    table = {(r["server"], r["concurrency"]): r for r in median_table(rows, "grpc-peers")}
    ours, theirs = table.get(("dlscale", 32)), table.get(("mlserver", 32))
    if ours and theirs:
        out["identity_c32_throughput_ratio"] = round(ours["throughput"] / theirs["throughput"], 2)
        out["identity_c32_p99_ratio"] = round(ours["p99_ms"] / theirs["p99_ms"], 2)
    resnet = {r["server"]: r for r in median_table(rows, "grpc-resnet")}
    if "dlscale" in resnet and "onnxruntime-inprocess" in resnet:
        served = resnet["dlscale"]["throughput"]
        out["resnet50_served_over_inprocess"] = round(
            served / resnet["onnxruntime-inprocess"]["throughput"], 3
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """`serve` (the server process) or the benchmarks (`make bench` runs `all`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(prog="benchmarks.serve_grpc serve")
        parser.add_argument("repo", type=Path)
        parser.add_argument("--port", type=int, default=0)
        args = parser.parse_args(argv[1:])
        asyncio.run(serve(args.repo, args.port))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="?", default="all", choices=("all", "peers", "resnet"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--resnet-duration", type=float, default=20.0)
    args = parser.parse_args(argv)
    repo = WORK / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    models.build_identity(repo)
    models.write_dlscale_config(repo, IDENTITY)
    rows: list[dict[str, Any]] = []
    info = machine()
    print(json.dumps(info), flush=True)
    if args.which in ("all", "peers"):
        peers.ensure_mlserver()
        info["mlserver"] = peers.mlserver_version()
        run_peers(repo, args.repeats, args.duration, rows)
    if args.which in ("all", "resnet"):
        run_resnet(repo, args.repeats, args.resnet_duration, rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"grpc-{args.which}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    summary = ratios(rows)
    out.write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows,
                               "ratios": summary}, indent=1))  # fmt: skip
    for bench in ("grpc-peers", "grpc-resnet"):
        table = median_table(rows, bench)
        if table:
            print(f"\n## {bench} (medians of {args.repeats})\n\n{markdown(table)}")
    print(f"\nratios: {json.dumps(summary)}\nraw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
