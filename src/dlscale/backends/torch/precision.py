"""Precision for the torch backend: whole-model casts, autocast, TF32 switches and FP8 Linears."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dlscale.backends.torch.options import Precision
from dlscale.errors import ConfigError

#: The dtype activations (and, without autocast, weights) take under each precision. FP8 runs
#: its matrix products in FP8 and everything between them in BF16.
COMPUTE_DTYPES: dict[Precision, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.bfloat16,
}
#: FP8 matrix products need Ada (8.9) or Hopper (9.0) and later.
FP8_MIN_CAPABILITY = (8, 9)
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
#: torch._scaled_mm wants both dimensions of its second operand divisible by 16.
FP8_ALIGNMENT = 16


@dataclass(frozen=True)
class PrecisionPlan:
    """How one model computes: the dtype of its activations and whether autocast chooses."""

    precision: Precision
    autocast: bool
    device_type: str

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
        """A floating-point input in the compute dtype; integer inputs (token ids) as they are."""
        if tensor.is_floating_point() and tensor.dtype != self.compute_dtype:
            return tensor.to(self.compute_dtype)
        return tensor


def check_supported(precision: Precision, device: torch.device) -> None:
    """Refuse a precision the device cannot run, saying what would."""
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(
            "backend_options.precision: 'tf32' is a mode of NVIDIA tensor cores (Ampere and "
            f"later); device {device} has none: use 'fp32' or 'bf16'"
        )
    if precision == "fp8":
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        if not fp8_supported(capability):
            raise ConfigError(
                "backend_options.precision: 'fp8' needs a CUDA device of compute capability "
                f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or later (Ada, Hopper); "
                f"device {device} has {capability or 'none'}: use 'bf16' or 'fp16'"
            )


def fp8_supported(capability: tuple[int, int] | None) -> bool:
    """Whether a CUDA compute capability (None: not a CUDA device) has FP8 tensor cores."""
    return capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY


def apply_precision(module: nn.Module, plan: PrecisionPlan) -> nn.Module:
    """The module with its weights in the plan's dtype (FP8 Linears where the shapes allow).

    The whole-model cast comes first: `module.to(dtype)` casts every floating-point tensor,
    FP8 ones included, so the FP8 weights are made after it.
    """
    if not plan.autocast and plan.compute_dtype != torch.float32:
        module = module.to(plan.compute_dtype)
    if plan.precision == "fp8":
        to_fp8(module)
    return module


class Fp8Linear(nn.Module):
    """A Linear computed by torch._scaled_mm on FP8 (E4M3) operands with per-tensor scales.

    The weight is quantized once, scaled so its largest magnitude meets E4M3's 448; each
    activation is scaled the same way on the fly, so no calibration is needed. The output
    dimension is padded to a multiple of 16 and the padding dropped from the result.
    """

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, out_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        self.out_features = weight.shape[0]
        padded = -self.out_features % FP8_ALIGNMENT
        if padded:
            weight = torch.cat([weight, weight.new_zeros(padded, weight.shape[1])])
        scale = weight.abs().amax().clamp(min=1e-12) / E4M3_MAX
        self.out_dtype = out_dtype
        self.register_buffer("weight_fp8", (weight / scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.reshape(()))
        bias = None
        if linear.bias is not None:
            bias = linear.bias.detach().to(out_dtype)
            if padded:
                bias = torch.cat([bias, bias.new_zeros(padded)])
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
        quantized = (rows.float() / scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            quantized,
            self.weight_fp8.t(),  # column-major, as _scaled_mm wants its second operand
            scale_a=scale,
            scale_b=self.weight_scale,
            bias=self.bias,
            out_dtype=self.out_dtype,
        )
        return out[:, : self.out_features].reshape(*x.shape[:-1], self.out_features)


def to_fp8(module: nn.Module) -> int:
    """Swap every Linear whose input width is a multiple of 16 for an Fp8Linear; the count."""
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.in_features % FP8_ALIGNMENT == 0:
            setattr(module, name, Fp8Linear(child))
            swapped += 1
        else:
            swapped += to_fp8(child)
    return swapped


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
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]
    try:
        yield
    finally:
        with _lock:
            _fp32_claims[mode] -= 1
