"""Shared memory against the socket: dlscale and a real Triton server, same client, same run.

    python -m benchmarks.shm [--repeats 3] [--duration 5] [--resnet-duration 10] [--no-resnet]

Both servers run in their own processes with OMP/OPENBLAS/MKL threads at 1: dlscale
(`dlscale serve --allow-client-shm`) and Triton 2.51 from nvidia-pytriton (its own venv,
benchmarks/pytriton_server.py). Each is measured by `dlscale bench` (MLPerf LoadGen Offline,
4 requests in flight) over three paths: binary REST, gRPC raw contents, and system shared memory
(regions registered once over REST, inputs copied into them per query by the client, outputs
written by the server into an output region and copied out by the client). Models: `identity`
(FP32 [batch, 3, 224, 224], 32 images = 19 MB per request) and `resnet50` (the zoo's ONNX file,
8 images per request). One core's memcpy bandwidth of the same 19 MB is measured in every
repetition: the limit a path that copies the payload once cannot pass. Servers and paths
alternate within each repetition; results go to bench-results/shm-*.json, medians printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.models import build_image_repository
from benchmarks.harness.servers import HOST, RESULTS, WORK, start_dlscale, start_triton
from benchmarks.harness.statistics import machine, median_of, memcpy_gbps, paired_ratios
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions

IMAGE_BYTES = 3 * 224 * 224 * 4
PATHS = ("rest", "grpc", "system-shm")
#: model -> (images per request, minimum seconds per run is set from the command line)
BATCH = {"identity": 32, "resnet50": 8}


# -- the measurements ------------------------------------------------------------------------------


def measure(url: str, model: str, shared_memory: str, duration: float) -> dict[str, Any]:
    """One `dlscale bench` Offline run: images/s and the errors it met."""
    options = BenchOptions(
        model=model,
        scenarios=[Scenario.OFFLINE],
        duration_s=duration,
        batch_size=BATCH[model],
        concurrency=4,
        sample_count=64,
        warmup_s=1.0,
        shared_memory=shared_memory,
        # Triton's metadata gives resnet50's output as [-1, -1]: say how much room it needs.
        output_shm_size=None if model == "identity" else 64 * 1024,
    )
    with tempfile.TemporaryDirectory() as out:
        report = bench(url, options, Path(out))
    result = report["scenarios"][0]["result"]
    return {
        "images_per_s": result["throughput_samples_per_s"] or 0.0,
        "errors": result["errors"]["count"],
        "first_error": (result["errors"]["first"] or [""])[0],
    }


def run(repeats: int, duration: float, resnet_duration: float, resnet: bool) -> dict[str, Any]:
    """Every (server, model, path), servers alternating within each repetition."""
    repo = build_image_repository(WORK / "shm-repo", resnet)
    names = ["identity"] + (["resnet50"] if (repo / "resnet50").is_dir() else [])
    dlscale, d_http, d_grpc = start_dlscale(repo, names)
    triton, t_http, t_grpc = start_triton(repo, names)
    urls = {
        "dlscale": {"rest": f"http://{HOST}:{d_http}", "grpc": f"grpc://{HOST}:{d_grpc}"},
        "triton": {"rest": f"http://{HOST}:{t_http}", "grpc": f"grpc://{HOST}:{t_grpc}"},
    }
    rows: list[dict[str, Any]] = []
    memcpy: list[float] = []
    try:
        for rep in range(repeats):
            memcpy.append(memcpy_gbps())
            print(f"repetition {rep + 1}: memcpy {memcpy[-1]:.2f} GB/s", flush=True)
            order = ["dlscale", "triton"] if rep % 2 == 0 else ["triton", "dlscale"]
            for model in names:
                seconds = duration if model == "identity" else resnet_duration
                for path in PATHS:
                    for server in order:
                        url = urls[server]["grpc" if path == "grpc" else "rest"]
                        shm = "system" if path == "system-shm" else "none"
                        row = {"rep": rep, "server": server, "model": model, "path": path}
                        row |= measure(url, model, shm, seconds)
                        row["gbps"] = row["images_per_s"] * IMAGE_BYTES / 1e9
                        rows.append(row)
                        print("  " + json.dumps(row), flush=True)
    finally:
        dlscale.stop()
        triton.stop()
    return {"machine": machine(), "rows": rows, "memcpy_gbps": memcpy, "table": table(rows, memcpy)}


def table(rows: list[dict[str, Any]], memcpy: list[float]) -> list[dict[str, Any]]:
    """Medians per (model, path, server), with dlscale's ratio to Triton and to memcpy."""
    copy = statistics.median(memcpy)
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for path in PATHS:
            medians = {}
            for server in ("dlscale", "triton"):
                seen = any(
                    (r["model"], r["path"], r["server"]) == (model, path, server) for r in rows
                )
                medians[server] = (
                    median_of(rows, "gbps", model=model, path=path, server=server) if seen else 0.0
                )
            ratios = paired_ratios(rows, "gbps", "dlscale", "triton", model=model, path=path)
            out.append(
                {
                    "model": model,
                    "path": path,
                    "dlscale_gbps": round(medians["dlscale"], 4),
                    "triton_gbps": round(medians["triton"], 4),
                    "dlscale_images_s": round(medians["dlscale"] * 1e9 / IMAGE_BYTES, 1),
                    "triton_images_s": round(medians["triton"] * 1e9 / IMAGE_BYTES, 1),
                    "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
                    "dlscale_share_of_memcpy": round(medians["dlscale"] / copy, 3),
                }
            )
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table of BENCHMARKS.md."""
    lines = [
        "| model | path | dlscale GB/s (img/s) | Triton GB/s (img/s) | dlscale / Triton | "
        "dlscale / memcpy |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["table"]:
        lines.append(
            f"| {row['model']} | {row['path']} | {row['dlscale_gbps']:.3f} "
            f"({row['dlscale_images_s']}) | {row['triton_gbps']:.3f} ({row['triton_images_s']}) "
            f"| {row['ratio_median']} | {row['dlscale_share_of_memcpy']:.1%} |"
        )
    copy = statistics.median(result["memcpy_gbps"])
    lines.append(f"\nOne core's memcpy of 19 MB: {copy:.2f} GB/s (median).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="identity: seconds per run")
    parser.add_argument("--resnet-duration", type=float, default=10.0)
    parser.add_argument("--no-resnet", action="store_true")
    args = parser.parse_args(argv)
    WORK.mkdir(exist_ok=True)
    result = run(args.repeats, args.duration, args.resnet_duration, not args.no_resnet)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"shm-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
