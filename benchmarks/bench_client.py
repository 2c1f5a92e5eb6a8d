"""The bench client's own ceiling: in process against `--workers N`, against a null server.

    python -m benchmarks.bench_client [--repeats 3] [--duration 4] [--workers 2]

`dlscale serve` in a child process serves two null-backend models (they compute nothing and
echo their input): `small`, FP32 [1,16] per request, and `large`, FP32 [32,3,224,224] per request
(19 MB each way). `dlscale bench` (LoadGen Offline, no ceiling run of its own) drives each over
binary REST and gRPC, with the in-process client and with worker processes; what it reaches is
the client's ceiling, since the server does nothing. Configurations alternate within each
repetition; medians are printed and the rows go to bench-results/bench-client-*.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.servers import RESULTS
from benchmarks.harness.statistics import machine
from dlscale.bench.ceiling import null_server
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.bench.targets import ModelInfo
from dlscale.types import Datatype, TensorSpec

#: name -> (sample shape, rows per request, requests in flight).
SHAPES = {"small": ((16,), 1, 8), "large": ((3, 224, 224), 32, 4)}


def _info(name: str) -> ModelInfo:
    shape = (-1, *SHAPES[name][0])
    tensor = (TensorSpec("x", Datatype.FP32, shape),)
    out = (TensorSpec("y", Datatype.FP32, shape),)
    return ModelInfo(name, tensor, out, batched=True, max_batch_size=SHAPES[name][1])


def _run(url: str, name: str, workers: int, duration: float, out: Path) -> dict[str, Any]:
    _, rows, concurrency = SHAPES[name]
    options = BenchOptions(
        name,
        [Scenario.OFFLINE],
        duration_s=duration,
        batch_size=rows,
        concurrency=concurrency,
        workers=workers,
        client_ceiling=False,
        sample_count=64,
    )
    report = bench(url, options, out)
    res = report["scenarios"][0]["result"]
    return {
        "model": name,
        "protocol": url.split("://")[0],
        "workers": workers,
        "throughput": res["throughput_samples_per_s"],
        "requests_per_s": (res["throughput_samples_per_s"] or 0) / rows,
        "request_p50_ms": (res["request_latency_s"]["p50"] or 0) * 1e3,
        "valid": res["valid"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SHAPES:
            with null_server(_info(name), SHAPES[name][1]) as ports:
                urls = [f"http://{ports['http']}", f"grpc://{ports['grpc']}"]
                for n in range(args.repeats):
                    for url in urls:
                        for workers in (0, args.workers):
                            out = Path(tmp) / f"{name}-{n}-{workers}-{url.split(':')[0]}"
                            rows.append(_run(url, name, workers, args.duration, out))
                            print(json.dumps(rows[-1]), flush=True)
    _print_medians(rows, args.workers)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"bench-client-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    print(f"rows: {path}")
    return 0


def _print_medians(rows: list[dict[str, Any]], workers: int) -> None:
    print(f"| request | protocol | in process (req/s) | --workers {workers} (req/s) | ratio |")
    print("|---|---|---:|---:|---:|")
    for name in SHAPES:
        for protocol in ("http", "grpc"):

            def median(w: int, name: str = name, protocol: str = protocol) -> float:
                return statistics.median(
                    r["requests_per_s"]
                    for r in rows
                    if r["model"] == name and r["protocol"] == protocol and r["workers"] == w
                )

            alone, spread = median(0), median(workers)
            print(f"| {name} | {protocol} | {alone:,.1f} | {spread:,.1f} | {spread / alone:.2f} |")


if __name__ == "__main__":
    raise SystemExit(main())
