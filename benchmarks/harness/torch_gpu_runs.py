"""Measurements behind benchmarks/torch_gpu.py: served Offline, direct calls, PyTorch alone.

Each function measures one thing the same way for every variant, so that rows of the report
compare like with like: samples/s over at least `seconds`, after a warm-up, median over runs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch

from dlscale.models.zoo import ZOO
from dlscale.models.zoo.gpu import GpuServing, gpu_config
from dlscale.models.zoo.images import labelled_images
from dlscale.models.zoo.inputs import as_input_type
from dlscale.serving.batcher import Batcher
from dlscale.serving.manager import ModelManager
from dlscale.serving.runners import BatchRunner

Arrays = dict[str, np.ndarray]


@dataclass
class Served:
    """One served variant's figures."""

    load_s: float
    runs: list[float] = field(default_factory=list)  # Offline samples/s, one per repetition
    direct: float = 0.0

    @property
    def offline(self) -> float:
        """The median Offline rate."""
        return statistics.median(self.runs) if self.runs else 0.0


def sample_batch(name: str, batch: int, input_type: str, device: str, seed: int = 1) -> Arrays:
    """A batch of the zoo's samples as `input_type`, in pinned memory on a GPU host."""
    model = ZOO[name]
    arrays = as_input_type(model, model.sample(batch, np.random.default_rng(seed)), input_type)
    if device == "cpu":
        return arrays
    out = {}
    for key, array in arrays.items():
        pinned = torch.empty(array.shape, dtype=torch.from_numpy(array).dtype, pin_memory=True)
        pinned.copy_(torch.from_numpy(array))
        out[key] = pinned.numpy()
    return out


def rate(run: Callable[[], object], rows: int, seconds: float, sync: bool = False) -> float:
    """Samples/s of `run` (one batch of `rows`) over at least `seconds`, after a warm-up."""
    run()
    if sync:
        torch.cuda.synchronize()
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < seconds:
        run()
        count += 1
        if sync and count % 8 == 0:
            torch.cuda.synchronize()
    if sync:
        torch.cuda.synchronize()
    return rows * count / (time.perf_counter() - start)


def write_served(
    folder: Path,
    name: str,
    serving: GpuServing,
    device: str,
    *,
    packaged: bool,
    buckets: list[int] | None,
    extra: dict[str, Any] | None = None,
) -> None:
    """folder/config.toml for a variant whose 1/ holds its model file already."""
    config = gpu_config(name, serving, device, packaged=packaged, buckets=buckets)
    config["name"] = folder.name
    config["backend_options"].update(extra or {})
    if device == "cpu":
        config["backend_options"].setdefault("static_buckets", True)
    (folder / "config.toml").write_text(tomli_w.dumps(config))


def serve_offline(
    repo: Path,
    model: str,
    inputs: Arrays,
    batch: int,
    seconds: float,
    reps: int,
    checks: list[Arrays] | None = None,
) -> tuple[Served, list[Arrays]]:
    """Serve `repo/model` and measure it; also its outputs on each batch of `checks`.

    Offline: every request (of `batch` rows) queued at once and all answered, as an MLPerf
    Offline system receives its samples, median of `reps` runs; direct: the backend of the
    first instance called in a loop on the same batch.
    """

    async def run() -> tuple[Served, list[Arrays]]:
        manager = ModelManager.open(repo)
        start = time.perf_counter()
        await manager.load(model)
        figures = Served(load_s=time.perf_counter() - start)
        try:
            served = manager.get(model)
            runner = served.runner
            assert isinstance(runner, BatchRunner), f"{model} is not a model of batched tensors"
            batcher = runner.batcher
            slots = sum(i.slots for i in served.instances)
            outputs = [await batcher.infer(c) for c in checks or []]
            await all_answered(batcher, inputs, 2 * slots)
            backend = served.instances[0].backend
            # Enough requests for `seconds` at a first guess of the rate.
            guess = rate(lambda: backend.infer(inputs), batch, 0.3)
            requests = max(4 * slots, int(guess * len(served.instances) * seconds / batch))
            for _ in range(reps):
                t0 = time.perf_counter()
                await all_answered(batcher, inputs, requests)
                figures.runs.append(requests * batch / (time.perf_counter() - t0))
            figures.direct = rate(lambda: backend.infer(inputs), batch, seconds)
            return figures, outputs
        finally:
            await manager.close()

    return asyncio.run(run())


async def all_answered(batcher: Batcher, inputs: Arrays, requests: int) -> None:
    """Queue `requests` requests at once and wait until every one is answered.

    Answers are dropped as they come, as LoadGen drops response data outside accuracy mode:
    keeping them all would hold gigabytes of pinned memory (bert-base returns 393 KB a sample).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = requests
    failures: list[BaseException] = []

    def answered(future: asyncio.Future[Arrays]) -> None:
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


def pytorch_alone(name: str, batch: int, device: str, seconds: float, reps: int) -> dict[str, Any]:
    """PyTorch's own best without dlscale: FP16, channels_last, reduce-overhead, freezing.

    resnet50 is torchvision's (random weights: speed does not depend on them); bert-base is
    the zoo's module (no transformers package on the machine). Data is on the GPU already.
    """
    import torch._inductor.config as inductor_config

    source = "zoo"
    if name == "resnet50":
        try:
            import torchvision  # type: ignore[import-not-found]

            module = torchvision.models.resnet50(weights=None)
            source = "torchvision"
        except ImportError:
            module = ZOO[name].torch_module()
    else:
        module = ZOO[name].torch_module()
    on_gpu = device != "cpu"
    dtype = torch.float16 if on_gpu else torch.float32
    module = module.eval().to(device=device, dtype=dtype)
    samples = ZOO[name].sample(batch, np.random.default_rng(1))
    args = [torch.from_numpy(a).to(device) for a in samples.values()]
    if name == "resnet50":
        module = module.to(memory_format=torch.channels_last)
        args = [args[0].to(dtype).contiguous(memory_format=torch.channels_last)]
    inductor_config.freezing = True
    try:
        compiled = torch.compile(module, mode="reduce-overhead" if on_gpu else "default")
        with torch.inference_mode():
            start = time.perf_counter()
            for _ in range(3):
                compiled(*args)
            if on_gpu:
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            runs = [rate(lambda: compiled(*args), batch, seconds, sync=on_gpu) for _ in range(reps)]
    finally:
        inductor_config.freezing = False
    return {"source": source, "runs": runs, "rate": statistics.median(runs), "compile_s": compile_s}


def images_and_labels(count: int) -> tuple[np.ndarray, np.ndarray]:
    """resnet50's labelled synthetic images (FP32, normalized) for top-1 checks."""
    return labelled_images(count, np.random.default_rng(11))
