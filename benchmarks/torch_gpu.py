"""The torch backend on one GPU: Offline throughput through dlscale's batcher, per precision.

For resnet50 and bert-base (S=128) and each of FP32, TF32, FP16, BF16 and FP8 (where the GPU
has it), the script
1. loads the backend directly with CUDA graphs captured for a ladder of batch sizes, times each
   and keeps the best batch size;
2. serves the model at that batch size through ModelManager + Batcher (1 and 2 instances on the
   GPU) and runs Offline: every sample queued at once, as requests of that batch size, as an
   MLPerf Offline SUT receives them; and times the backend called directly on the same loaded
   instance at the same batch size;
3. reports samples/s, the share of the GPU's compute roofline at that precision, the share of
   the MLPerf per-GPU H100 record for ResNet-50 (91,826 img/s, TensorRT INT8), and the batcher
   path over the direct call (target ≥ 90%);
4. profiles the best FP16 run of each model for a few batches (PyTorch profiler, eager, so that
   kernels are visible) and writes the top kernels.

One command, sized for 10 minutes on an H100 (combinations left when --budget runs out are
reported as not run):

    PYTHONPATH=src python benchmarks/torch_gpu.py --out results/torch_gpu

`--device cpu` runs the same pipeline on the CPU (static buckets instead of CUDA graphs, no
pinned memory), to check the script on a machine without a GPU:

    PYTHONPATH=src python benchmarks/torch_gpu.py --device cpu --models resnet50 \
        --precisions fp32 --ladder 2 4 --seconds 0.2 --instances 1 --out /tmp/torch_cpu

Writes OUT/torch_gpu.json, OUT/torch_gpu.md and OUT/profile_<model>_<precision>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch.files import write_module_spec
from dlscale.backends.torch.precision import fp8_supported
from dlscale.errors import DlscaleError
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.model import WEIGHT_SEED
from dlscale.serving.batcher import Batcher
from dlscale.serving.manager import ModelManager
from dlscale.types import Datatype, TensorSpec

MLPERF_H100_RESNET50 = 91_826  # img/s per GPU, Offline, v3.0 closed (reference/mlperf.md)
#: Batch sizes tried directly, per model: up to where H100 throughput stops growing.
LADDERS = {"resnet50": [64, 128, 256, 512], "bert-base": [32, 64, 128, 256]}
PRECISIONS = ["fp16", "bf16", "fp8", "tf32", "fp32"]  # most telling first, for --budget
#: Dense peaks (TFLOP/s) from shared/reference/accelerators.md, for when dlscale.hardware's
#: catalog is not installed: (pattern in torch's device name, fp32, tf32, fp16/bf16, fp8).
PEAKS = [
    ("H100 PCIe", 51, 378, 756, 1513),
    ("H100", 67, 494.5, 989, 1979),
    ("H200", 67, 494.5, 989, 1979),
    ("A100", 19.5, 156, 312, 0),
    ("L40S", 91.6, 183, 362, 733),
    ("L4", 30.3, 60, 121, 242.5),
]


@dataclass
class Result:
    """One model at one precision."""

    model: str
    precision: str
    status: str = "ok"
    ladder: dict[int, float] = field(default_factory=dict)  # batch -> direct samples/s
    best_batch: int = 0
    direct: float = 0.0  # samples/s, backend called directly at best_batch (served instance)
    batcher: dict[int, float] = field(default_factory=dict)  # instances -> Offline samples/s
    flops_per_sample: float = 0.0
    peak_flops: float | None = None
    roofline_share: float | None = None
    mlperf_share: float | None = None
    batcher_over_direct: float | None = None
    seconds: float = 0.0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    on_gpu = args.device != "cpu"
    if on_gpu and not torch.cuda.is_available():
        print("torch_gpu: no CUDA device (try --device cpu for a dry run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(0) if on_gpu else f"CPU ({os.cpu_count()} cores)"
    start = time.perf_counter()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="dlscale-torch-gpu-") as tmp:
        files = {name: _module_file(Path(tmp), name, args.half_inputs) for name in args.models}
        flops = {name: _flops_per_sample(name) for name in args.models}
        for precision in args.precisions:
            for name in args.models:
                result = Result(name, precision, flops_per_sample=flops[name])
                results.append(result)
                if time.perf_counter() - start > args.budget:
                    result.status = f"not run: past the {args.budget:.0f} s budget"
                    continue
                capability = torch.cuda.get_device_capability(0) if on_gpu else None
                if precision == "fp8" and not fp8_supported(capability):
                    result.status = "not run: FP8 needs compute capability 8.9"
                    continue
                t0 = time.perf_counter()
                try:
                    _measure(result, files[name], Path(tmp), args)
                except (DlscaleError, RuntimeError) as exc:
                    result.status = f"failed: {exc}"
                result.seconds = time.perf_counter() - t0
                _shares(result, device_name if on_gpu else "")
                print(_line(result), flush=True)
        if args.profile and on_gpu:
            for name in args.models:
                best = _best(results, name, "fp16")
                if best and time.perf_counter() - start < args.budget + 60:
                    _profile(files[name], name, best.best_batch, args)
    report = _report(results, device_name, on_gpu, time.perf_counter() - start)
    report["inputs"] = "fp16" if args.half_inputs else "fp32"
    (args.out / "torch_gpu.json").write_text(json.dumps(report, indent=2))
    (args.out / "torch_gpu.md").write_text(_markdown(report))
    print((args.out / "torch_gpu.md").read_text())
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/torch_gpu"))
    p.add_argument("--models", nargs="+", default=list(LADDERS), choices=list(LADDERS))
    p.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    p.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    p.add_argument("--budget", type=float, default=420.0, help="seconds before skipping the rest")
    p.add_argument("--instances", nargs="+", type=int, default=[1, 2])
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a dry run")
    p.add_argument(
        "--half-inputs",
        action="store_true",
        help="declare float inputs FP16 (half the bytes over PCIe) instead of FP32",
    )
    p.add_argument("--ladder", nargs="+", type=int, help="batch sizes to try (default per model)")
    return p


# -- the model files and what they compute ---------------------------------------------------


def _module_file(tmp: Path, name: str, half_inputs: bool) -> Path:
    """A model.zoo file building the zoo model from its PyTorch definition."""
    model = ZOO[name]
    path = tmp / f"{name}.zoo"
    inputs = [s.with_batch() for s in model.inputs()]
    if half_inputs:
        inputs = [TensorSpec(s.name, _half(s.datatype), s.shape) for s in inputs]
    write_module_spec(
        path,
        model.factory,
        {"seed": WEIGHT_SEED},
        inputs,
        [s.with_batch() for s in model.outputs()],
    )
    return path


def _half(datatype: Datatype) -> Datatype:
    return Datatype.FP16 if datatype is Datatype.FP32 else datatype


def _flops_per_sample(name: str) -> float:
    """FLOPs of one sample, counted by torch.utils.flop_counter on the module (CPU, batch 1)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = ZOO[name]
    module = model.torch_module()
    inputs = [torch.from_numpy(a) for a in model.sample(1, np.random.default_rng(0)).values()]
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        module(*inputs)
    return float(counter.get_total_flops())


def _settings(name: str, precision: str, device: str) -> dict[str, Any]:
    graphs = "cuda_graphs" if device != "cpu" else "static_buckets"
    extra: dict[str, Any] = {"precision": precision, graphs: True}
    if name == "resnet50":
        extra["channels_last"] = True
    return extra


# -- measuring ----------------------------------------------------------------------------------


def _pinned_batch(name: str, batch: int, device: str, half: bool = False) -> dict[str, np.ndarray]:
    """A batch of samples in pinned host memory, as an MLPerf harness holds its sample set."""
    samples = ZOO[name].sample(batch, np.random.default_rng(1))
    if half:
        samples = {
            k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in samples.items()
        }
    if device == "cpu":
        return samples
    out = {}
    for key, array in samples.items():
        pinned = torch.empty(array.shape, dtype=torch.from_numpy(array).dtype, pin_memory=True)
        pinned.copy_(torch.from_numpy(array))
        out[key] = pinned.numpy()
    return out


def _rate(run: Callable[[], object], rows: int, seconds: float) -> float:
    """Samples/s of `run` (one batch of `rows`) over at least `seconds`, after a warm-up."""
    run()
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < seconds:
        run()
        count += 1
    return rows * count / (time.perf_counter() - start)


def _measure(result: Result, file: Path, tmp: Path, args: argparse.Namespace) -> None:
    name, ladder = result.model, args.ladder or LADDERS[result.model]
    extra = _settings(name, result.precision, args.device) | {"batch_buckets": ladder}
    options = BackendOptions(device=args.device, max_batch_size=max(ladder), extra=extra)
    backend = create_backend("torch", file, options)
    backend.load()
    try:
        for batch in ladder:
            inputs = _pinned_batch(name, batch, args.device, args.half_inputs)
            result.ladder[batch] = _rate(partial(backend.infer, inputs), batch, args.seconds)
    finally:
        backend.unload()
    result.best_batch = max(result.ladder, key=lambda b: result.ladder[b])
    for count in args.instances:
        rate, direct = _offline(result, file, tmp, count, args)
        result.batcher[count] = rate
        result.direct = max(result.direct, direct)


def _offline(
    result: Result, file: Path, tmp: Path, instances: int, args: argparse.Namespace
) -> tuple[float, float]:
    """(Offline samples/s through the batcher, direct samples/s on one of its instances)."""
    folder = tmp / "repo" / result.model
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.zoo").write_bytes(file.read_bytes())
    batch, seconds = result.best_batch, args.seconds
    settings = _settings(result.model, result.precision, args.device)
    config = {
        "backend": "torch",
        "max_batch_size": batch,
        "instances": [{"count": instances, "device": args.device}],
        "backend_options": settings | {"batch_buckets": [batch]},
    }
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    inputs = _pinned_batch(result.model, batch, args.device, args.half_inputs)
    # Enough requests for `seconds` at the direct rate measured on the ladder.
    requests = max(8, int(result.ladder[batch] * seconds / batch))

    async def run() -> tuple[float, float]:
        manager = ModelManager.open(tmp / "repo")
        await manager.load(result.model)
        try:
            served = manager.get(result.model)
            await _all_answered(served.batcher, inputs, 2 * instances)
            start = time.perf_counter()
            await _all_answered(served.batcher, inputs, requests)
            offline = requests * batch / (time.perf_counter() - start)
            backend = served.instances[0].backend
            direct = _rate(lambda: backend.infer(inputs), batch, seconds)
            return offline, direct
        finally:
            await manager.close()

    return asyncio.run(run())


async def _all_answered(batcher: Batcher, inputs: dict[str, np.ndarray], requests: int) -> None:
    """Queue `requests` requests at once and wait until every one is answered.

    Answers are dropped as they come, as LoadGen drops response data outside accuracy mode:
    keeping them all would hold gigabytes of pinned memory (bert-base returns 393 KB a sample)
    and make the caching host allocator pin fresh memory for every batch.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = requests
    failures: list[BaseException] = []

    def answered(future: asyncio.Future[dict[str, np.ndarray]]) -> None:
        nonlocal left
        if not future.cancelled() and future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]
        left -= 1
        if left == 0 and not done.done():
            done.set_result(None)

    for _ in range(requests):
        batcher.submit(inputs).add_done_callback(answered)
    await done
    if failures:
        raise failures[0]


def _profile(file: Path, name: str, batch: int, args: argparse.Namespace) -> None:
    """Top CUDA kernels of a few eager FP16 batches (graphs hide kernels from the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    precision, out = "fp16", args.out
    extra = _settings(name, precision, args.device) | {"cuda_graphs": False}
    backend = create_backend(
        "torch", file, BackendOptions(device=args.device, max_batch_size=batch, extra=extra)
    )
    backend.load()
    try:
        inputs = _pinned_batch(name, batch, args.device, args.half_inputs)
        backend.infer(inputs)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                backend.infer(inputs)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        (out / f"profile_{name}_{precision}.txt").write_text(
            f"{name} {precision} batch {batch}, 5 batches, eager (no CUDA graphs)\n\n{table}\n"
        )
    finally:
        backend.unload()


# -- reporting ----------------------------------------------------------------------------------


def _peak(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s at a precision: dlscale's catalog when present, else PEAKS."""
    if not device_name:
        return None
    key = "fp32" if precision == "fp32" else precision
    try:
        from dlscale.hardware.catalog import match

        spec = match(device_name, torch.cuda.get_device_properties(0).total_memory)
        if spec is not None:
            value = spec.peak_flops(key)
            return float(value) if value else None
    except ImportError:
        pass
    column = {"fp32": 1, "tf32": 2, "fp16": 3, "bf16": 3, "fp8": 4}[precision]
    for row in PEAKS:
        if str(row[0]) in device_name:
            return float(row[column]) * 1e12 or None
    return None


def _shares(result: Result, device_name: str) -> None:
    if result.status != "ok":
        return
    best = max(result.batcher.values(), default=0.0)
    result.peak_flops = _peak(device_name, result.precision)
    if result.peak_flops:
        result.roofline_share = best * result.flops_per_sample / result.peak_flops
    if result.model == "resnet50":
        result.mlperf_share = best / MLPERF_H100_RESNET50
    if result.direct and result.batcher:
        # Like for like: one instance behind the batcher against that backend called directly.
        single = result.batcher[min(result.batcher)]
        result.batcher_over_direct = single / result.direct


def _best(results: list[Result], name: str, precision: str) -> Result | None:
    return next(
        (r for r in results if r.model == name and r.precision == precision and r.best_batch),
        None,
    )


def _line(r: Result) -> str:
    if r.status != "ok":
        return f"{r.model} {r.precision}: {r.status}"
    batcher = ", ".join(f"{k} inst {v:,.0f}/s" for k, v in sorted(r.batcher.items()))
    return (
        f"{r.model} {r.precision}: best batch {r.best_batch}, direct {r.direct:,.0f}/s, "
        f"batcher {batcher} ({r.seconds:.0f} s)"
    )


def _report(
    results: list[Result], device_name: str, on_gpu: bool, seconds: float
) -> dict[str, Any]:
    return {
        "device": device_name,
        "capability": list(torch.cuda.get_device_capability(0)) if on_gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "seconds": seconds,
        "mlperf_h100_resnet50_offline": MLPERF_H100_RESNET50,
        "results": [asdict(r) for r in results],
    }


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# torch backend on {report['device']} (torch {report['torch']}, CUDA {report['cuda']})",
        "",
        "Offline through ModelManager + Batcher, requests of the best batch size, "
        f"{report.get('inputs', 'fp32').upper()} inputs in pinned host memory, CUDA graphs per "
        "bucket (resnet50: channels_last).",
        "",
        "| model | precision | best batch | batcher samples/s (1 / 2 instances) | direct "
        "samples/s | batcher (1 instance) / direct | roofline share | MLPerf H100 share | "
        "status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        batcher = " / ".join(f"{v:,.0f}" for _, v in sorted(r["batcher"].items())) or "–"
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['best_batch'] or '–'} | {batcher} | "
            f"{r['direct']:,.0f} | {_pct(r['batcher_over_direct'])} | "
            f"{_pct(r['roofline_share'])} | {_pct(r['mlperf_share'])} | {r['status']} |"
        )
    lines += [
        "",
        "Shares use the best batcher rate (any instance count). "
        "Roofline share: best batcher samples/s × FLOPs per sample (torch.utils.flop_counter) "
        "over the GPU's dense peak at that precision. FP8 runs only Linear layers in FP8 "
        "(ResNet-50's convolutions stay BF16), yet is set against the FP8 peak.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
