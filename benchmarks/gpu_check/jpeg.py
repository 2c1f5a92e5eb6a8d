"""gpu-check's jpeg stage: a classifier fed JPEGs decoded on the device, against the same model
fed decoded tensors, both in process through the same DataPlane and batchers.

    python -m benchmarks.gpu_check.jpeg --device cuda --out DIR [--seconds 5] [--reps 3]

On a GPU: the zoo's resnet50-e2e built for the device (models/zoo/e2e.py: the image step
decoding with nvJPEG and handing its pixels on in device memory to resnet50 on the torch backend
of the same device, run here in FP16, then the top-k step). On the CPU (the dry run that keeps
this from rotting): smallcnn-e2e, decoded by libjpeg-turbo. The other side is the pipeline's
classifier alone, fed the same images' pixels (decoded once, before, by the same image step).
Offline: every request of --batch rows queued at once and all answered, median of --reps runs,
the two sides alternating; the ratio is the pipeline's rate over the classifier's (the JPEG
side also pays the top-k step). Writes OUT/jpeg.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import tomllib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from dlscale.models.zoo.catalog import RESNET50
from dlscale.models.zoo.e2e import SMALLCNN, image_pipeline
from dlscale.models.zoo.jpegs import synthetic_jpegs
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

#: (pipeline, classifier zoo model, resize, crop) per device kind.
PIPELINES = {
    "cuda": ("resnet50-e2e", RESNET50, 256, 224),
    "cpu": ("smallcnn-e2e", SMALLCNN, 73, 64),
}


def build(root: Path, device: str, precision: str) -> tuple[str, str, str]:
    """The pipeline for the device; returns (pipeline, image step, classifier step)."""
    kind = "cpu" if device == "cpu" else "cuda"
    name, classifier, resize, crop = PIPELINES[kind]
    image_pipeline(root, name, classifier, resize, crop, device=device)
    config = tomllib.loads((root / name / "config.toml").read_text())
    steps = [s["model"] for s in config["steps"]]
    image, model = steps[0], steps[1]
    if kind == "cuda":
        # The figure is FP16: the torch classifier runs at that precision.
        path = root / model / "config.toml"
        found = tomllib.loads(path.read_text())
        found.setdefault("backend_options", {})["precision"] = precision
        path.write_text(tomli_w.dumps(found))
    return name, image, model


def column(jpegs: list[bytes]) -> np.ndarray:
    """BYTES [n, 1], one JPEG per row."""
    out = np.empty((len(jpegs), 1), object)
    for i, jpeg in enumerate(jpegs):
        out[i, 0] = jpeg
    return out


def host(array: Any) -> np.ndarray:
    """A step's output on the host (a device array, CuPy's, is copied down once)."""
    return np.asarray(array.get() if hasattr(array, "get") else array)


async def offline(send: Callable[[int], Coroutine[Any, Any, Any]], requests: int) -> float:
    """Seconds to answer `requests` requests queued at once."""
    start = time.perf_counter()
    await asyncio.gather(*(send(i) for i in range(requests)))
    return time.perf_counter() - start


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides, alternating within each repetition; rows per second."""
    root = args.out / "repo"
    pipeline, image, classifier = build(root, args.device, args.precision)
    manager = ModelManager.open(root)
    await manager.load(pipeline)
    try:
        plane = DataPlane(manager)
        jpegs = synthetic_jpegs(args.images, seed=5)
        batches = [column(jpegs[i : i + args.batch]) for i in range(0, len(jpegs), args.batch)]
        decoder = manager.get(image).instances[0].backend
        pixels = [host(decoder.infer({"image": b})["pixels"]) for b in batches]

        feeds = {pipeline: ("image", batches), classifier: ("input", pixels)}

        def request(model: str, i: int) -> Coroutine[Any, Any, Any]:
            name, arrays = feeds[model]
            return plane.infer(InferenceRequest(model, {name: arrays[i % len(arrays)]}))

        sides = {"jpegs": pipeline, "tensors": classifier}
        rates: dict[str, list[float]] = {k: [] for k in sides}
        # A first pass sizes the runs: enough requests for --seconds at the rate it saw.
        sized = {}
        for key, model in sides.items():
            took = await offline(lambda i, m=model: request(m, i), 4)
            sized[key] = max(4, int(args.seconds / max(took / 4, 1e-6)))
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
            for key in order:
                n = sized[key]
                took = await offline(lambda i, m=sides[key]: request(m, i), n)
                rates[key].append(n * args.batch / took)
        medians = {k: statistics.median(v) for k, v in rates.items()}
        return {
            "device": args.device,
            "pipeline": pipeline,
            "classifier": classifier,
            "precision": args.precision if args.device != "cpu" else "fp32",
            "batch": args.batch,
            "images": args.images,
            "rates": rates,
            "jpegs_per_s": medians["jpegs"],
            "tensors_per_s": medians["tensors"],
            "ratio": medians["jpegs"] / medians["tensors"],
        }
    finally:
        await manager.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="rows per request (<= 64)")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--precision", default="fp16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = asyncio.run(measure(args))
    (args.out / "jpeg.json").write_text(json.dumps(data, indent=2))
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
