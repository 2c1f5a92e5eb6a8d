"""TensorFlow Serving's REST route against the Open Inference Protocol's, same model, same run.

    python -m benchmarks.tfserving_rest [--repeats 3] [--duration 4] [--concurrency 16]

One `dlscale serve` process serves `identity` (FP32 [1, 16] per request) and `mlp` (FP32
[8, 256] per request); the project's closed-loop client (benchmarks/harness/clients.py) sends
the same numbers as OIP JSON (`POST /v2/models/M/infer`, `data`) and as TensorFlow Serving's row
format (`POST /v1/models/M:predict`, `instances`), the two routes alternating within each
repetition. The answers are compared once before measuring. Printed: medians, and the median of
the per-repetition ratios TF Serving / OIP of throughput (BENCHMARKS.md's target: within 10%)
and of the server's CPU time per answered request (steadier on a busy machine). Results go to
bench-results/tfserving-rest-*.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvloop

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.models import (
    IDENTITY,
    MLP,
    BenchModel,
    build_identity,
    build_mlp,
    write_dlscale_config,
)
from benchmarks.harness.servers import HOST, RESULTS, ServerProcess, cpu_seconds, start_dlscale
from benchmarks.harness.statistics import machine, median_table, paired_ratios, record

#: model -> rows per request
LOADS: list[tuple[BenchModel, int]] = [(IDENTITY, 1), (MLP, 8)]
ROUTES = ("oip", "tfserving")


def bodies(model: BenchModel, rows: int) -> dict[str, tuple[str, bytes]]:
    """Each route's path and body, carrying the same numbers."""
    x = model.rows(rows)
    return {
        "oip": (f"/v2/models/{model.name}/infer", model.json_body(rows)),
        "tfserving": (f"/v1/models/{model.name}:predict", orjson.dumps({"instances": x.tolist()})),
    }


def answers_agree(port: int, model: BenchModel, rows: int) -> None:
    """One request on each route; their outputs must be the same array."""
    got = {}
    for route, (path, body) in bodies(model, rows).items():
        request = urllib.request.Request(
            f"http://{HOST}:{port}{path}", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            doc = json.loads(response.read())
        if route == "oip":
            out = doc["outputs"][0]
            got[route] = np.array(out["data"], np.float32).reshape(out["shape"])
        else:
            got[route] = np.array(doc["predictions"], np.float32)
    if not np.array_equal(got["oip"], got["tfserving"]):
        raise RuntimeError(f"{model.name}: the two routes answered different arrays")


def measure(
    server: ServerProcess, rep: int, args: argparse.Namespace, rows: list[dict[str, Any]]
) -> None:
    """Both routes on every model, the route order turned each repetition; the server's CPU
    time per answered request is taken over the measured window alone (no warm-up in it)."""
    port = server.port
    for model, n in LOADS:
        requests = bodies(model, n)
        for route in ROUTES if rep % 2 == 0 else ROUTES[::-1]:
            path, body = requests[route]
            wire = build_request(HOST, port, path, body)
            uvloop.run(closed_loop(HOST, port, wire, args.concurrency, 1.0, warmup_s=0.0))
            before = cpu_seconds(server.proc.pid)
            result = uvloop.run(
                closed_loop(HOST, port, wire, args.concurrency, args.duration, warmup_s=0.0)
            )
            cpu = cpu_seconds(server.proc.pid) - before
            answered = len(result.latencies_s)
            record(
                rows,
                bench="tfserving-rest",
                rep=rep,
                server=route,
                model=f"{model.name} x{n}",
                concurrency=args.concurrency,
                cpu_us=round(1e6 * cpu / answered, 1) if answered else 0.0,
                **result.summary(),
            )


def main() -> None:
    """Run the comparison and print the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        build_identity(repo)
        build_mlp(repo)
        for model, _ in LOADS:
            write_dlscale_config(repo, model)
        server, port, _ = start_dlscale(repo, [m.name for m, _ in LOADS])
        try:
            for model, n in LOADS:
                answers_agree(port, model, n)
            for rep in range(args.repeats):
                print(f"repetition {rep + 1}/{args.repeats}", flush=True)
                measure(server, rep, args, rows)
        finally:
            server.stop()
    table = median_table(rows, "tfserving-rest")
    for row in table:
        print(json.dumps(row))
    for model, n in LOADS:
        label = f"{model.name} x{n}"
        for key in ("throughput", "cpu_us"):
            ratios = paired_ratios(rows, key, "tfserving", "oip", model=label)
            each = ", ".join(f"{r:.3f}" for r in ratios)
            print(
                f"{label}: TF Serving / OIP {key}, median of {len(ratios)}: "
                f"{float(np.median(ratios)):.3f} (each: {each})"
            )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"tfserving-rest-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, "medians": table}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
