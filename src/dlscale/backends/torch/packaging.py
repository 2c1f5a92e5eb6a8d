"""Compile a model file ahead of time, with the settings it would be served with, into a package.

`package_model` loads a model.zoo / .pt2 file the way the backend does (the same folding,
precision, layout and boundary conversions, prepare.py), exports it with a dynamic batch
dimension and compiles it with AOTInductor under the compile mode and freezing the settings ask
for. The package then serves without the settings compiled into it: the backend refuses them
(prepare.py, `check_package`), since they are in the file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from dlscale.backends.base import BackendOptions
from dlscale.backends.torch.aoti import PackageInfo, build_package, device_capability
from dlscale.backends.torch.boundary import inductor_options
from dlscale.backends.torch.device import place
from dlscale.backends.torch.files import load_model
from dlscale.backends.torch.options import parse_torch_options
from dlscale.backends.torch.precision import check_supported, fp32_mode
from dlscale.backends.torch.prepare import check_fits, prepared, resolved_options
from dlscale.backends.torch.tensors import torch_dtype
from dlscale.errors import ConfigError
from dlscale.types import TensorSpec

#: AOTInductor runs no inductor CUDA graphs of its own; the backend captures its own.
_NOT_FOR_AOT = ("triton.cudagraphs",)


@dataclass(frozen=True)
class Packaged:
    """A package written, what it holds, and how long the compile took."""

    path: Path
    info: PackageInfo
    compile_s: float


def package_model(source: Path, options: BackendOptions, out: Path) -> Packaged:
    """Compile `source` for `options.device` into `out` (a .aoti.pt2), batches 1 to max."""
    if options.max_batch_size < 1:
        raise ConfigError("packaging needs a batched model (max_batch_size > 0)")
    settings = parse_torch_options(options.extra)
    device = place(options.device)
    model = load_model(source, device)
    if model.kind not in ("module", "export"):
        raise ConfigError(f"{source}: packages are built from a model.zoo or model.pt2")
    # The package is compiled without graphs (the server captures its own around it).
    s = resolved_options(settings, model, device, options.max_batch_size)
    check_supported(s.precision, device)
    check_fits(source, model, s, options.max_batch_size)
    started = time.perf_counter()
    # no_grad, not inference_mode: tensors made under inference_mode (folded BatchNorm, cast
    # weights) are inference tensors, which torch.export refuses outside that mode.
    with fp32_mode(s.precision, device), torch.no_grad():
        boundary = prepared(model, s, device)
        flops = _flops_per_sample(boundary, model.inputs, device)
    configs = {
        k: v
        for k, v in inductor_options(s.compile_mode, bool(s.freezing)).items()
        if k not in _NOT_FOR_AOT
    }
    info = PackageInfo(
        inputs=model.inputs,
        outputs=model.outputs,
        device=device.type,
        precision=s.precision,
        channels_last=bool(s.channels_last),
        max_batch=options.max_batch_size,
        mode=s.compile_mode,
        freezing=bool(s.freezing),
        flops_per_sample=flops,
        torch_version=torch.__version__,
        capability=device_capability(device),
    )
    with fp32_mode(s.precision, device):
        build_package(boundary, _example(model.inputs, 2, device), info, out, configs)
    return Packaged(out, info, time.perf_counter() - started)


def _example(specs: list[TensorSpec], rows: int, device: torch.device) -> list[torch.Tensor]:
    """Zeros of every input at `rows` rows (ids of 0 are valid tokens, pixels of 0 black)."""
    return [
        torch.zeros((rows, *s.shape[1:]), dtype=torch_dtype(s.datatype), device=device)
        for s in specs
    ]


def _flops_per_sample(
    module: torch.nn.Module, specs: list[TensorSpec], device: torch.device
) -> float:
    """torch's flop counter over one sample (matrix products, convolutions, attention)."""
    counter = FlopCounterMode(display=False)
    with counter:
        module(*_example(specs, 1, device))
    return float(counter.get_total_flops())
