"""From a loaded model file to the module the backend runs: checks, folding, precision, layout.

One place for it, so that the backend serving a model and the packager compiling it ahead of
time (aoti.py) build the very same module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dlscale.backends.torch.boundary import Boundary, has_convolution
from dlscale.backends.torch.files import LoadedModel
from dlscale.backends.torch.lowp import fold_batchnorm
from dlscale.backends.torch.options import TorchOptions, resolve
from dlscale.backends.torch.precision import PrecisionPlan, apply_precision, lowp_layers
from dlscale.errors import ConfigError

#: Settings that mean nothing for a package (it is compiled already).
_COMPILING = ("autocast", "compile", "compile_mode", "compile_backend", "freezing", "lowp_convs")


def resolved_options(
    settings: TorchOptions, model: LoadedModel, device: torch.device, max_batch_size: int
) -> TorchOptions:
    """The settings with what was left open chosen for this device and model."""
    fixed = all(-1 not in spec.shape[1:] for spec in model.inputs)
    batched = max_batch_size > 0 or settings.batch_buckets is not None
    four_d = any(len(spec.shape) == 4 for spec in model.inputs)
    return resolve(
        settings,
        on_cuda=device.type == "cuda",
        can_bucket=fixed and batched,
        convolutional=four_d and model.kind != "aoti" and has_convolution(model.module),
    )


def check_fits(path: Path, model: LoadedModel, s: TorchOptions, max_batch_size: int) -> None:
    """Refuse settings this model cannot take, naming the key."""
    if s.compile and model.kind in ("torchscript", "aoti"):
        what = "TorchScript" if model.kind == "torchscript" else "an AOTInductor package"
        raise ConfigError(
            f"{path}: torch.compile does not take {what}; set compile = false"
            + ("" if model.kind == "aoti" else ", or give a model.pt2 or model.zoo")
        )
    if s.precision in ("fp8", "int8") and model.kind not in ("module", "aoti"):
        raise ConfigError(
            f"{path}: precision {s.precision!r} swaps nn.Linear and nn.Conv2d modules, which "
            "only a model.zoo module has (an exported or scripted graph has none left)"
        )
    if s.bucketed:
        if max_batch_size < 1 and s.batch_buckets is None:
            raise ConfigError(
                "backend_options: batch buckets need max_batch_size > 0 or batch_buckets"
            )
        variable = [i.name for i in model.inputs if -1 in i.shape[1:]]
        if variable:
            raise ConfigError(
                f"{path}: batch buckets need fixed non-batch dimensions; inputs "
                f"{variable} have variable ones"
            )
    four_d = any(len(i.shape) == 4 for i in model.inputs)
    if s.channels_last and model.kind != "aoti" and not four_d:
        raise ConfigError(
            "backend_options.channels_last: needs a 4-D (N, C, H, W) input; this model "
            f"has {[list(i.shape) for i in model.inputs]}"
        )
    if model.package is not None and max_batch_size > model.package.max_batch:
        raise ConfigError(
            f"{path}: the package takes batches of up to {model.package.max_batch}, below "
            f"max_batch_size {max_batch_size}; build it again for the larger batch"
        )


def check_package(path: Path, model: LoadedModel, extra: Mapping[str, Any]) -> None:
    """Refuse settings that contradict what a package was compiled with, or cannot apply."""
    info = model.package
    if info is None:
        return
    given = sorted(k for k in _COMPILING if k in extra and extra[k] not in (False, None))
    if given:
        raise ConfigError(
            f"{path}: an AOTInductor package is compiled already; {given} do not apply to it"
        )
    # Settings a package has compiled in: given for one, they must agree with it or be absent.
    baked = {"precision": info.precision, "channels_last": info.channels_last}
    for key, value in baked.items():
        if key in extra and extra[key] != value:
            raise ConfigError(
                f"backend_options.{key}: {extra[key]!r}, but {path} was compiled with "
                f"{value!r}; drop the key or build the package again"
            )


def precision_of(settings: TorchOptions, model: LoadedModel) -> str:
    """The precision the model computes in: the package's, else the settings'."""
    return model.package.precision if model.package is not None else settings.precision


def prepared(model: LoadedModel, s: TorchOptions, device: torch.device) -> Boundary:
    """The model's module folded, cast, laid out and wrapped in its boundary conversions."""
    plan = PrecisionPlan(s.precision, s.autocast, device.type, s.lowp_convs)
    module = model.module
    if model.kind == "module":
        module = fold_batchnorm(module)  # type: ignore[arg-type]
    module = apply_precision(module, plan)  # type: ignore[arg-type]
    if s.precision in ("fp8", "int8") and not lowp_layers(module):
        raise ConfigError(
            f"precision {s.precision!r} found no Linear or convolution it can run in 8 bits "
            "(their input widths must be multiples of 16)"
        )
    if s.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return Boundary(module, plan, bool(s.channels_last), model.outputs)
