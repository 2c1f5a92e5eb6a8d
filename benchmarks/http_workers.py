"""REST worker processes (`dlscale serve --http-workers N`) against one process, in one run.

    python -m benchmarks.http_workers [--repeats 3] [--duration 5] [--workers 0 1 2]

Servers with N = 0 (REST on the model process's own loop), 1 and 2 worker processes alternate
within each repetition, each measured by the project's closed-loop HTTP client
(benchmarks/harness/clients.py) on two requests: small (identity FP32 [1, 16], 16 streams) and large
(identity FP32 [32, 3, 224, 224], 19 MB each way, binary, 4 streams). Math libraries run one
thread per process. Results go to bench-results/http-workers-*.json; medians and the ratios to
N = 0 are printed. The client runs on the same machine and takes a core's share too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.models import build_large_repository
from benchmarks.harness.servers import HOST, RESULTS, start_dlscale
from benchmarks.harness.statistics import machine, median_table, record

#: name -> (model, shape of one request, streams)
REQUESTS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "small": ("identity16", (1, 16), 16),
    "large": ("identity", (32, 3, 224, 224), 4),
}


def binary_request(port: int, model: str, shape: tuple[int, ...]) -> bytes:
    """One binary-tensor inference request (JSON header, raw FP32 data), binary output asked."""
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32).tobytes()
    tensor = {"name": "input", "shape": list(shape), "datatype": "FP32"}
    header = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(data)}}],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return build_request(HOST, port, f"/v2/models/{model}/infer", header + data, headers)


def run_once(repo: Path, workers: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """Start a server with `workers`, measure both requests, stop it."""
    models = [m for m, _, _ in REQUESTS.values()]
    server, port, _ = start_dlscale(repo, models, ("--http-workers", str(workers)))
    try:
        for name, (model, shape, streams) in REQUESTS.items():
            wire = binary_request(port, model, shape)
            result = asyncio.run(closed_loop(HOST, port, wire, streams, duration))
            latencies = sorted(result.latencies_s)
            record(
                rows,
                bench="http-workers",
                server=f"N={workers}",
                model=name,
                concurrency=streams,
                throughput=result.throughput,
                p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
                p99_ms=1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
                errors=result.errors,
                first_error=result.first_error,
            )
    finally:
        server.stop()


def ratios(table: list[dict[str, Any]]) -> list[str]:
    """Each N's median throughput and p50 against N = 0, per request size."""
    lines = []
    base = {row["model"]: row for row in table if row["server"] == "N=0"}
    for row in table:
        ref = base.get(row["model"])
        if ref is None or row["server"] == "N=0" or not ref["throughput"]:
            continue
        throughput = row["throughput"] / ref["throughput"]
        p50 = row["p50_ms"] / ref["p50_ms"]
        lines.append(
            f"{row['model']:5s} {row['server']}: throughput x{throughput:.2f}, "
            f"p50 x{p50:.2f} (against N=0)"
        )
    return lines


def main() -> None:
    """Run the comparison and print the medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        repo = build_large_repository(Path(folder))
        for repeat in range(args.repeats):
            print(f"repetition {repeat + 1}/{args.repeats}", flush=True)
            for workers in args.workers:
                run_once(repo, workers, args.duration, rows)
    table = median_table(rows, "http-workers")
    for row in table:
        print(json.dumps(row))
    for line in ratios(table):
        print(line)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"http-workers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, "medians": table}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
