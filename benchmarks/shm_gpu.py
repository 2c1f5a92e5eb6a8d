"""resnet50 FP16 on the torch backend: served through shared memory against in process (GPU).

One command on a GPU machine (about 5 minutes on an H100; needs CuPy for the CUDA path):

    PYTHONPATH=src:. python -m benchmarks.shm_gpu [--batch 256] [--duration 20]

The zoo's resnet50 (model.zoo, FP16, channels_last, CUDA graphs, one instance on cuda:0) is
measured by `dlscale bench` Offline at the same batch size three ways, alternating, twice each:
in process (the batcher, no server), through `dlscale serve --allow-client-shm` with system
shared memory (page-locked regions: the host-to-device copy is a DMA from the region) and with
CUDA shared memory (the inputs used in place on the GPU, outputs written there). Target: each
served path at least 90% of in process. Writes bench-results/shm-gpu-*.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.servers import HOST, RESULTS, WORK, start_dlscale
from dlscale.backends.torch.files import write_module_spec
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.hardware.detect import detect
from dlscale.models.zoo import ZOO, build_zoo
from dlscale.models.zoo.model import WEIGHT_SEED


def build(root: Path, batch: int) -> Path:
    """resnet50 as a torch model.zoo, FP16 with CUDA graphs on cuda:0."""
    build_zoo(root, ["resnet50"])
    model = ZOO["resnet50"]
    write_module_spec(
        root / "resnet50" / "1" / "model.zoo",
        model.factory,
        {"seed": WEIGHT_SEED},
        [s.with_batch() for s in model.inputs()],
        [s.with_batch() for s in model.outputs()],
    )
    (root / "resnet50" / "1" / "model.onnx").unlink(missing_ok=True)
    (root / "resnet50" / "config.toml").write_text(
        f'backend = "torch"\nmax_batch_size = {batch}\n[batching]\nmax_queue_delay_us = 500\n'
        '[[instances]]\ncount = 1\ndevice = "cuda:0"\n'
        '[backend_options]\nprecision = "fp16"\nchannels_last = true\ncuda_graphs = true\n'
    )
    return root


def measure(url: str | None, repo: Path, batch: int, shm: str, duration: float) -> float:
    """Images/s of one Offline run (url None: in process)."""
    options = BenchOptions(
        model="resnet50",
        scenarios=[Scenario.OFFLINE],
        repo=None if url else repo,
        duration_s=duration,
        batch_size=batch,
        concurrency=4,
        sample_count=2 * batch,
        shared_memory=shm,
        output_shm_size=None,
    )
    with tempfile.TemporaryDirectory() as out:
        report = bench(url, options, Path(out))
    return float(report["scenarios"][0]["result"]["throughput_samples_per_s"] or 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    repo = build(WORK / "shm-gpu-repo", args.batch)
    server, http, _ = start_dlscale(repo, ["resnet50"])
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeats):
            for path, url, shm in (
                ("in-process", None, "none"),
                ("system-shm", f"http://{HOST}:{http}", "system"),
                ("cuda-shm", f"http://{HOST}:{http}", "cuda"),
            ):
                rate = measure(url, repo, args.batch, shm, args.duration)
                rows.append({"rep": rep, "path": path, "images_per_s": rate})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    medians = {
        p: statistics.median(r["images_per_s"] for r in rows if r["path"] == p)
        for p in ("in-process", "system-shm", "cuda-shm")
    }
    base = medians["in-process"] or 1.0
    gpus = detect().gpus
    result: dict[str, Any] = {"device": gpus[0].name if gpus else "unknown", "batch": args.batch}
    result["rows"] = rows
    result["medians"] = medians
    result["ratios"] = {p: v / base for p, v in medians.items()}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"shm-gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{result['device']}, resnet50 FP16 torch, batch {args.batch}")
    print("| path | images/s | of in-process |\n|---|---|---|")
    for path, value in medians.items():
        print(f"| {path} | {value:,.0f} | {value / base:.1%} |")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
