"""Precision for the torch backend: whole-model casts, autocast, TF32 switches, FP8 and INT8."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dlscale.backends.half_precision import HALF_DOT_FLAGS, emulated
from dlscale.backends.torch.lowp import LowpConv2d, LowpLinear, to_lowp
from dlscale.backends.torch.options import Precision
from dlscale.errors import ConfigError
from dlscale.hardware.cpu import read_cpu

#: The dtype activations (and, without autocast, weights) take under each precision. FP8 and
#: INT8 run their matrix products in 8 bits and everything between them in 16.
COMPUTE_DTYPES: dict[Precision, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.bfloat16,
    "int8": torch.float16,
}
#: FP8 matrix products need Ada (8.9) or Hopper (9.0) and later.
FP8_MIN_CAPABILITY = (8, 9)
#: INT8 tensor-core products (torch._int_mm through cuBLASLt) need Turing (7.5) and later.
INT8_MIN_CAPABILITY = (7, 5)
LOWP_LAYERS = (LowpLinear, LowpConv2d)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionPlan:
    """How one model computes: the dtype of its activations and whether autocast chooses."""

    precision: Precision
    autocast: bool
    device_type: str
    #: FP8 / INT8: which convolutions become low-precision products (none, pointwise, all).
    lowp_convs: str = "pointwise"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype floating-point inputs are converted to at the boundary."""
        return torch.float32 if self.autocast else COMPUTE_DTYPES[self.precision]

    def context(self) -> contextlib.AbstractContextManager[object]:
        """torch.autocast to the precision's dtype when asked for, else nothing."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=COMPUTE_DTYPES[self.precision])

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """A floating-point input in the compute dtype; integer inputs (ids, pixels) as they are."""
        if tensor.is_floating_point() and tensor.dtype != self.compute_dtype:
            return tensor.to(self.compute_dtype)
        return tensor


def check_supported(precision: Precision, device: torch.device) -> None:
    """Refuse a precision the device cannot run, saying what would; warn of one it emulates."""
    # The CPU is read (psutil, its clock) only for the 16-bit types, not on every load.
    if (
        device.type == "cpu"
        and precision in HALF_DOT_FLAGS
        and emulated(precision, read_cpu().flags)
    ):
        log.warning(
            "backend_options.precision: %r on this CPU is emulated (it has none of %s): "
            "expect it slower than 'fp32'",
            precision,
            ", ".join(sorted(HALF_DOT_FLAGS[precision])),
        )
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(
            "backend_options.precision: 'tf32' is a mode of NVIDIA tensor cores (Ampere and "
            f"later); device {device} has none: use 'fp32' or 'bf16'"
        )
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if precision == "fp8" and not fp8_supported(capability):
        raise ConfigError(
            "backend_options.precision: 'fp8' needs a CUDA device of compute capability "
            f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or later (Ada, Hopper); "
            f"device {device} has {capability or 'none'}: use 'bf16' or 'fp16'"
        )
    if precision == "int8" and capability is not None and capability < INT8_MIN_CAPABILITY:
        raise ConfigError(
            "backend_options.precision: 'int8' needs compute capability 7.5 or later (INT8 "
            f"tensor cores); device {device} has {capability}: use 'fp16'"
        )


def fp8_supported(capability: tuple[int, int] | None) -> bool:
    """Whether a CUDA compute capability (None: not a CUDA device) has FP8 tensor cores."""
    return capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY


def apply_precision(module: nn.Module, plan: PrecisionPlan) -> nn.Module:
    """The module with its weights in the plan's dtype (8-bit layers where the shapes allow).

    The whole-model cast comes first: `module.to(dtype)` casts every floating-point tensor,
    8-bit ones included, so the 8-bit weights are made after it.
    """
    if not plan.autocast and plan.compute_dtype != torch.float32:
        module = module.to(plan.compute_dtype)
    if plan.precision in ("fp8", "int8"):
        to_lowp(module, plan.precision, plan.lowp_convs)
    return module


def lowp_layers(module: nn.Module) -> int:
    """How many layers of the module compute in FP8 or INT8."""
    return sum(isinstance(m, LOWP_LAYERS) for m in module.modules())


# -- TF32: process-wide switches, so models in one process must agree ----------------------------

_lock = threading.Lock()
_fp32_claims: collections.Counter[str] = collections.Counter()


@contextlib.contextmanager
def fp32_mode(precision: Precision, device: torch.device) -> Iterator[None]:
    """Hold the process's FP32 matmul/conv mode ("ieee" or "tf32") while a model is loaded.

    PyTorch's TF32 switches are process-wide, so an FP32 model and a TF32 model on CUDA in one
    process would silently share one mode; the second to load is refused instead.
    """
    if device.type != "cuda" or precision not in ("fp32", "tf32"):
        yield
        return
    mode = "tf32" if precision == "tf32" else "ieee"
    with _lock:
        others = [m for m, n in _fp32_claims.items() if n and m != mode]
        if others:
            raise ConfigError(
                f"backend_options.precision: {precision!r} needs FP32 mode {mode!r}, but a model "
                f"loaded in this process holds {others[0]!r} (PyTorch's TF32 switches are "
                "process-wide): serve the two in separate processes or give both one precision"
            )
        _fp32_claims[mode] += 1
        # Through the legacy switches, which set the new per-backend precisions too: set only
        # through the new API, torch.get_float32_matmul_precision() (inductor's autotuning
        # reads it) raises on the mix of the two.
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
    try:
        yield
    finally:
        with _lock:
            _fp32_claims[mode] -= 1
