"""Large tensors over the socket: dlscale before and after the copy removal, and Triton, one run.

    python -m benchmarks.large [--before 5e1d6be] [--after HEAD] [--repeats 3] [--duration 4]
                               [--only LABEL] [--no-triton]

Three servers, each in its own process with OMP/OPENBLAS/MKL threads at 1: `dlscale serve` of two
revisions (checked out once under .bench/revisions/, as benchmarks/revisions.py does) and a real
Triton 2.51 (nvidia-pytriton's tritonserver, its own venv, benchmarks/pytriton_server.py). Each
is driven by the same closed-loop clients (benchmarks/harness/clients.py over binary REST,
benchmarks/harness/grpc_clients.py over gRPC raw contents) with two models: `identity` FP32
[32, 3, 224, 224] per request (19 MB in, 19 MB out) at 4 requests in flight, and `identity16`
FP32 [1, 16] at 32 in flight. One core's memcpy bandwidth of the same 19 MB is measured in every
repetition. Servers alternate within each repetition; the table gives medians of requests/s and
GB/s of input payload, each server's ratio to Triton and to the `before` revision (the median of
the ratios within each repetition, so that the machine's drift cancels), and the
server's CPU time per request (its process tree, /proc), which does not depend on how fast the
client on the same cores is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.loads import LOADS, drive
from benchmarks.harness.models import LARGE, SMALL, build_large_repository
from benchmarks.harness.revisions import checkout, start_revision
from benchmarks.harness.servers import RESULTS, WORK, ServerProcess, cpu_seconds, start_triton
from benchmarks.harness.statistics import (
    machine,
    median_of,
    memcpy_gbps,
    paired_ratios,
    record,
)

SERVERS = ("before", "after", "triton")


def start_all(
    repo: Path, before: str, after: str, triton: bool = True
) -> dict[str, tuple[ServerProcess, int, int]]:
    """The servers (Triton unless `triton` is False), started once and kept for every repetition."""
    names = [LARGE.name, SMALL.name]
    started: dict[str, tuple[ServerProcess, int, int]] = {}
    try:
        for side, revision in (("before", before), ("after", after)):
            started[side] = start_revision(checkout(revision), repo)
        if triton:
            started["triton"] = start_triton(repo, names)
    except BaseException:
        for server, _, _ in started.values():
            server.stop()
        raise
    return started


def run(
    before: str, after: str, repeats: int, duration: float, only: str, triton: bool = True
) -> dict[str, Any]:
    """Every (load, server), servers alternating within each repetition."""
    WORK.mkdir(exist_ok=True)
    repo = build_large_repository(WORK / "large-repo")
    servers = start_all(repo, before, after, triton)
    rows: list[dict[str, Any]] = []
    memcpy: list[float] = []
    try:
        for rep in range(repeats):
            memcpy.append(memcpy_gbps())
            print(f"repetition {rep + 1}: memcpy {memcpy[-1]:.2f} GB/s", flush=True)
            sides = [s for s in SERVERS if s in servers]
            order = sides if rep % 2 == 0 else sides[::-1]
            for label, protocol, model, n, c in LOADS:
                if only not in label:
                    continue
                for side in order:
                    server, http, grpc_port = servers[side]
                    cpu = cpu_seconds(server.proc.pid)
                    r = drive(protocol, model, n, c, (http, grpc_port), duration)
                    # The server's CPU over warm-up and window, per request at the window's rate.
                    cpu_ms = (cpu_seconds(server.proc.pid) - cpu) / r.throughput / (duration + 1)
                    nbytes = n * int(np.prod(model.row_shape)) * 4
                    record(rows, server=side, load=label, rep=rep, **r.summary(),
                           gbps=round(r.throughput * nbytes / 1e9, 4),
                           server_cpu_ms=round(cpu_ms * 1e3, 3))  # fmt: skip
    finally:
        for server, _, _ in servers.values():
            server.stop()
    return {"machine": machine(), "before": before, "after": after, "rows": rows,
            "memcpy_gbps": memcpy}  # fmt: skip


def _median(rows: list[dict[str, Any]], side: str, load: str, key: str) -> float:
    return median_of(rows, key, server=side, load=load)


def _cell(rows: list[dict[str, Any]], side: str, load: str, key: str, spec: str) -> str:
    """A table cell: the median, or "-" for a server not run (--no-triton)."""
    if not any(r["server"] == side and r["load"] == load for r in rows):
        return "-"
    return format(_median(rows, side, load, key), spec)


def _paired(rows: list[dict[str, Any]], a: str, b: str, load: str) -> float:
    """The median over repetitions of a's throughput over b's in the same repetition."""
    return float(statistics.median(paired_ratios(rows, "throughput", a, b, load=load)))


def markdown(result: dict[str, Any]) -> str:
    """The table of BENCHMARKS.md: medians per load and server, and the ratios."""
    rows, copy = result["rows"], statistics.median(result["memcpy_gbps"])
    lines = [
        "| load | before req/s | after req/s | Triton req/s | after GB/s | after/before "
        "| after/Triton | after / memcpy | p99 ms before, after, Triton "
        "| server CPU ms/req before, after, Triton |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    triton = any(r["server"] == "triton" for r in rows)
    for label in dict.fromkeys(r["load"] for r in rows):
        b, a, t = (_cell(rows, s, label, "throughput", ",.1f") for s in SERVERS)
        p99 = ", ".join(_cell(rows, s, label, "p99_ms", ".1f") for s in SERVERS)
        cpu = ", ".join(_cell(rows, s, label, "server_cpu_ms", ".2f") for s in SERVERS)
        gbps = _median(rows, "after", label, "gbps")
        vs_triton = f"{_paired(rows, 'after', 'triton', label):.2f}" if triton else "-"
        lines.append(
            f"| {label} | {b} | {a} | {t} | {gbps:.3f} "
            f"| {_paired(rows, 'after', 'before', label):.2f} "
            f"| {vs_triton} | {gbps / copy:.1%} | {p99} | {cpu} |"
        )
    lines.append(f"\nOne core's memcpy of 19 MB: {copy:.2f} GB/s (median of the repetitions).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="5e1d6be", help="the revision before the change")
    parser.add_argument("--after", default="HEAD", help="the revision measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured per run")
    parser.add_argument("--only", default="", help="only the loads whose label holds this text")
    parser.add_argument(
        "--no-triton", action="store_true", help="the two revisions only (no Triton venv needed)"
    )
    args = parser.parse_args(argv)
    result = run(
        args.before, args.after, args.repeats, args.duration, args.only, not args.no_triton
    )
    text = markdown(result)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"large-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({**result, "table": text}, indent=1))
    print(f"{text}\n\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
