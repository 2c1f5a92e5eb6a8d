"""The zoo's models served on a GPU by the torch backend: their settings and repository entries.

On a GPU the fast path is PyTorch's own best: the module compiled by inductor with freezing
(conv/BN folding, constant folding), compiled ahead of time into an AOTInductor package so a
server loads it in seconds, replayed as one CUDA graph per batch bucket, channels_last for the
convolutional models, two batches in flight per instance (one uploads while one computes), and
inputs that cross PCIe small (resnet50: UINT8 pixels, normalized on the device). The precision
is FP16 unless asked otherwise; `dlscale optimize` decides it under the accuracy guard.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from dlscale.models.zoo.catalog import ZOO
from dlscale.models.zoo.inputs import InputType, torch_entry

#: Batches as large as an H100 needs to be busy (the zoo's CPU configs stop at 32-64).
GPU_MAX_BATCH = {"resnet50": 256, "bert-base": 256}
#: Inputs the models take on a GPU when not told otherwise.
GPU_INPUTS: dict[str, InputType] = {"resnet50": "uint8", "digits": "uint8"}
#: Requests that arrive within this of the oldest join its batch.
GPU_QUEUE_DELAY_US = 2000


@dataclass(frozen=True)
class GpuServing:
    """How one zoo model is served on a GPU."""

    precision: str = "fp16"
    input_type: InputType = "fp32"
    max_batch_size: int = 256
    instances: int = 1
    #: FP8 / INT8: which convolutions run as 8-bit products (see backends.md).
    lowp_convs: str | None = None
    #: Inductor compile mode the package is built with.
    compile_mode: str = "default"

    def compiled_settings(self) -> dict[str, Any]:
        """The [backend_options] that decide the compiled code (held by a package)."""
        settings: dict[str, Any] = {"precision": self.precision, "compile_mode": self.compile_mode}
        if self.lowp_convs is not None:
            settings["lowp_convs"] = self.lowp_convs
        return settings


def gpu_serving(name: str, **changes: Any) -> GpuServing:
    """The zoo's GPU settings for model `name`, with `changes` laid over them."""
    model = ZOO[name]
    default = GpuServing(
        input_type=GPU_INPUTS.get(name, "fp32"),
        max_batch_size=GPU_MAX_BATCH.get(name, model.max_batch_size),
    )
    return replace(default, **changes)


def gpu_config(
    name: str, serving: GpuServing, device: str, *, packaged: bool, buckets: list[int] | None = None
) -> dict[str, Any]:
    """config.toml for the GPU entry: a package's runtime settings, or compile at each load."""
    model = ZOO[name]
    entry = torch_entry(model, serving.input_type)
    options: dict[str, Any] = {} if packaged else {**serving.compiled_settings(), "compile": True}
    if buckets is not None:
        options["batch_buckets"] = buckets
    return {
        "name": name,
        "backend": "torch",
        "max_batch_size": serving.max_batch_size,
        "inputs": [{**s.to_dict(), "shape": list(s.shape[1:])} for s in entry.inputs],
        "outputs": [{**s.to_dict(), "shape": list(s.shape[1:])} for s in entry.outputs],
        "batching": {"max_queue_delay_us": GPU_QUEUE_DELAY_US},
        "instances": [{"count": serving.instances, "device": device}],
        "backend_options": options,
        "metadata": {"zoo": "true", "task": model.task, "gpu_input": serving.input_type},
    }


def write_gpu_entry(
    root: Path,
    name: str,
    device: str = "cuda:0",
    serving: GpuServing | None = None,
    *,
    package: bool = True,
) -> Path:
    """Write root/<name>/ to serve the zoo model on `device`; returns the folder.

    With `package` the module is compiled here, once, into 1/model.aoti.pt2 (about a minute
    for resnet50 on an H100 host; it must run on the kind of GPU that will serve it); without,
    1/model.zoo is written and the server compiles it at every load.
    """
    from dlscale.backends import BackendOptions

    serving = serving or gpu_serving(name)
    folder = root / name
    version = folder / "1"
    source = torch_entry(ZOO[name], serving.input_type).write(version / "model.zoo")
    if package:
        from dlscale.backends.torch.aoti import PACKAGE_NAME
        from dlscale.backends.torch.packaging import package_model

        options = BackendOptions(
            device=device, max_batch_size=serving.max_batch_size, extra=serving.compiled_settings()
        )
        package_model(source, options, version / PACKAGE_NAME)
        source.unlink()
    config = gpu_config(name, serving, device, packaged=package)
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    return folder
