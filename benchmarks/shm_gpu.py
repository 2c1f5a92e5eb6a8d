"""resnet50 FP16 on the torch backend: served over REST, gRPC and shared memory against in process.

One command on a GPU machine (about 5 minutes on an H100; needs CuPy for the CUDA path):

    PYTHONPATH=src:. python -m benchmarks.shm_gpu [--batch 256] [--duration 20] [--out DIR]

The zoo's resnet50 (model.zoo, FP16, channels_last, CUDA graphs, one instance on cuda:0) is
measured by `dlscale bench` Offline at the same batch size, alternating the paths, `--repeats`
times each: in process (the batcher, no server), then through `dlscale serve --allow-client-shm`
(fresh ports, the bench on the same host) over binary REST, gRPC, system shared memory
(page-locked regions: the host-to-device copy is a DMA from the region) and CUDA shared memory
(the inputs used in place on the GPU, outputs written there). The server is stopped by its
process id at the end. Targets: CUDA shared memory at least 90% of in process; binary REST at
least 4x the 1,246 images/s measured before (shared/reference/gpu-measured.md). Writes
OUT/served.json (after every run: a kill keeps what was measured) and prints a table.
`--device cpu --model mlp` is the dry run on a CPU (no CUDA path there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from math import ceil, prod
from pathlib import Path
from typing import Any

from benchmarks.harness.servers import HOST, RESULTS, WORK, start_dlscale
from dlscale.backends.torch.files import write_module_spec
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.hardware.detect import detect
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.model import WEIGHT_SEED

#: Binary REST measured before (shared/reference/gpu-measured.md), and the issue's factor.
REST_BEFORE = 1_246.0
PATHS = ("in-process", "rest", "grpc", "system-shm", "cuda-shm")


def build(root: Path, batch: int, model_name: str = "resnet50", device: str = "cuda:0") -> Path:
    """The model as a torch model.zoo: FP16 with CUDA graphs on a GPU, FP32 on the CPU."""
    # The factory builds the weights at load: no ONNX export (a minute for resnet50) is needed.
    (root / model_name / "1").mkdir(parents=True, exist_ok=True)
    model = ZOO[model_name]
    write_module_spec(
        root / model_name / "1" / "model.zoo",
        model.factory,
        {"seed": WEIGHT_SEED},
        [s.with_batch() for s in model.inputs()],
        [s.with_batch() for s in model.outputs()],
    )
    options = '[backend_options]\nprecision = "fp16"\nchannels_last = true\ncuda_graphs = true\n'
    (root / model_name / "config.toml").write_text(
        f'backend = "torch"\nmax_batch_size = {batch}\n[batching]\nmax_queue_delay_us = 500\n'
        f'[[instances]]\ncount = 1\ndevice = "{device}"\n' + (options if device != "cpu" else "")
    )
    return root


def _size_limits(model: str, batch: int) -> tuple[str, ...]:
    """Flags that let one request of `batch` rows through REST and gRPC: resnet50's batch of
    256 FP32 images is 147 MiB, over the default 64 MiB of each (docs/limits.md)."""
    row_bytes = sum(
        s.datatype.itemsize * prod(max(d, 1) for d in s.shape) for s in ZOO[model].inputs()
    )
    mib = str(max(64, ceil(batch * row_bytes * 1.1 / 2**20) + 1))  # framing beside the data
    return ("--max-body-mb", mib, "--max-grpc-mb", mib)


def measure(
    url: str | None, repo: Path, model: str, batch: int, shm: str, duration: float
) -> float:
    """Samples/s of one Offline run (url None: in process)."""
    options = BenchOptions(
        model=model,
        scenarios=[Scenario.OFFLINE],
        repo=None if url else repo,
        duration_s=duration,
        batch_size=batch,
        concurrency=4,
        sample_count=2 * batch,
        shared_memory=shm,
        output_shm_size=None,
        warmup_s=min(1.0, duration),
    )
    with tempfile.TemporaryDirectory() as out:
        report = bench(url, options, Path(out))
    return float(report["scenarios"][0]["result"]["throughput_samples_per_s"] or 0.0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a dry run")
    parser.add_argument("--model", default="resnet50", help="a zoo model (mlp on the CPU)")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--out", type=Path, help="folder for served.json (default: bench-results)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths = [p for p in args.paths if args.device != "cpu" or p != "cuda-shm"]
    repo = build(WORK / f"served-{args.model}-repo", args.batch, args.model, args.device)
    out_dir = args.out or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (
        "served.json" if args.out else f"shm-gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    gpus = detect().gpus
    result: dict[str, Any] = {
        "device": gpus[0].name if gpus and args.device != "cpu" else "cpu",
        "model": args.model,
        "batch": args.batch,
        "rows": [],
        "not_run": {} if len(paths) == len(args.paths) else {"cuda-shm": "no CUDA on the CPU"},
    }
    server, http, grpc = start_dlscale(repo, [args.model], _size_limits(args.model, args.batch))
    urls = {"rest": f"http://{HOST}:{http}", "grpc": f"grpc://{HOST}:{grpc}"}
    shm = {"system-shm": "system", "cuda-shm": "cuda"}
    try:
        for rep in range(args.repeats):
            for path in paths:
                url = None if path == "in-process" else urls.get(path, urls["rest"])
                rate = measure(
                    url, repo, args.model, args.batch, shm.get(path, "none"), args.duration
                )
                result["rows"].append({"rep": rep, "path": path, "samples_per_s": rate})
                print(json.dumps(result["rows"][-1]), flush=True)
                _summarise(result, paths)
                out.write_text(json.dumps(result, indent=2))
    finally:
        server.stop()  # by its process id (SIGTERM, then SIGKILL to its group)
    _print(result, out)
    return 0


def _summarise(result: dict[str, Any], paths: list[str]) -> None:
    """Medians per path, their ratio to in process, and REST against the figure before."""
    rows = result["rows"]
    medians = {
        p: statistics.median(r["samples_per_s"] for r in rows if r["path"] == p)
        for p in paths
        if any(r["path"] == p for r in rows)
    }
    base = medians.get("in-process") or 1.0
    result["medians"] = medians
    result["ratios"] = {p: v / base for p, v in medians.items()}
    result["rest_vs_before"] = medians.get("rest", 0.0) / REST_BEFORE


def _print(result: dict[str, Any], out: Path) -> None:
    print(f"\n{result['device']}, {result['model']} torch, batch {result['batch']}")
    print("| path | samples/s | of in-process |\n|---|---|---|")
    for path, value in result.get("medians", {}).items():
        print(f"| {path} | {value:,.0f} | {result['ratios'][path]:.1%} |")
    print(f"\nresults: {out}")


if __name__ == "__main__":
    raise SystemExit(main())
