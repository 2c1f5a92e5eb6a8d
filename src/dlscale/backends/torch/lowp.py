"""FP8 and INT8 layers: Linear and 2-D convolutions computed as low-precision matrix products.

A convolution over a channels-last input is a matrix product: a 1x1 convolution multiplies each
pixel's channels by the weight; a k x k one multiplies each output pixel's patch (k·k·C values,
gathered "im2col") by the flattened weight. Both go to `torch._scaled_mm` (FP8 E4M3, per-row
activation scales and per-output-channel weight scales, BF16 out) or `torch._int_mm` (INT8, the
same scales, rescaled to FP16). Activation scales are computed on the fly from each row's largest
magnitude, so no calibration is needed; under `torch.compile` the scaling, the cast and the
patch gathering fuse into one kernel ahead of the product.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Kind = Literal["fp8", "int8"]
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
INT8_MAX = 127.0
#: _scaled_mm wants K and N divisible by 16, _int_mm by 8: layers are swapped only when K is,
#: and N is padded up.
ALIGNMENT = 16
#: _int_mm on CUDA needs more than 16 rows: every INT8 product gets this many zero rows more
#: (always, so that an exported graph with a dynamic batch holds no guard on its size; compiled,
#: the padding fuses into the quantizing kernel).
INT_MM_PAD_ROWS = 16
#: The dtype each kind computes everything between its products in (rowwise _scaled_mm
#: returns BF16 only).
COMPUTE_DTYPES: dict[Kind, torch.dtype] = {"fp8": torch.bfloat16, "int8": torch.float16}


class LowpMatmul(nn.Module):
    """x @ Wᵀ (+ b) for x [M, K], W [N, K] quantized once per output channel, x per row."""

    weight_q: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: Kind) -> None:
        super().__init__()
        self.kind: Kind = kind
        self.out_dtype = COMPUTE_DTYPES[kind]
        weight = weight.detach().float()
        self.out_features = weight.shape[0]
        padded = -self.out_features % ALIGNMENT
        if padded:
            weight = torch.cat([weight, weight.new_zeros(padded, weight.shape[1])])
        top = E4M3_MAX if kind == "fp8" else INT8_MAX
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / top  # [N, 1]
        self.register_buffer("weight_q", _quantize(weight / scale, kind))
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(self.out_dtype).contiguous()
        )

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        top = E4M3_MAX if self.kind == "fp8" else INT8_MAX
        scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / top  # [M, 1]
        quantized = _quantize(rows.float() / scale, self.kind)
        if self.kind == "fp8":
            out = torch._scaled_mm(
                quantized,
                self.weight_q.t(),  # column-major, as _scaled_mm wants its second operand
                scale_a=scale,
                scale_b=self.weight_scale,
                out_dtype=self.out_dtype,
            )
        else:
            out = _int8_product(quantized, self.weight_q, scale, self.weight_scale)
        out = out[:, : self.out_features]
        return out if self.bias is None else out + self.bias


def _quantize(values: torch.Tensor, kind: Kind) -> torch.Tensor:
    if kind == "fp8":
        return values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def _int8_product(
    rows: torch.Tensor, weight: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor
) -> torch.Tensor:
    count = rows.shape[0]
    acc = torch._int_mm(F.pad(rows, (0, 0, 0, INT_MM_PAD_ROWS)), weight.t())[:count]
    return (acc.float() * row_scale * col_scale).to(COMPUTE_DTYPES["int8"])


class LowpLinear(nn.Module):
    """A Linear whose product runs in FP8 or INT8 (any leading dimensions)."""

    def __init__(self, linear: nn.Linear, kind: Kind) -> None:
        super().__init__()
        self.product = LowpMatmul(linear.weight, linear.bias, kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.product(x.reshape(-1, x.shape[-1]))
        return out.reshape(*x.shape[:-1], out.shape[-1])


class LowpConv2d(nn.Module):
    """A 2-D convolution (groups 1, no dilation) as a matrix product over channels-last pixels."""

    def __init__(self, conv: nn.Conv2d, kind: Kind) -> None:
        super().__init__()
        self.kernel: tuple[int, int] = (int(conv.kernel_size[0]), int(conv.kernel_size[1]))
        self.stride: tuple[int, int] = (int(conv.stride[0]), int(conv.stride[1]))
        padding = conv.padding  # not a string: convertible() checked it
        self.padding: tuple[int, int] = (int(padding[0]), int(padding[1]))
        out_ch = conv.out_channels
        # [Cout, Cin, kh, kw] -> [Cout, kh, kw, Cin]: the order the patches are gathered in.
        weight = conv.weight.detach().permute(0, 2, 3, 1).reshape(out_ch, -1)
        self.product = LowpMatmul(weight, conv.bias, kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        pixels = x.permute(0, 2, 3, 1)  # NHWC: a view when x is channels_last
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        if (kh, kw) == (1, 1) and (ph, pw) == (0, 0):
            patches = pixels[:, ::sh, ::sw, :]
        else:
            padded = F.pad(pixels, (0, 0, pw, pw, ph, ph))
            out_h = (padded.shape[1] - kh) // sh + 1
            out_w = (padded.shape[2] - kw) // sw + 1
            taps = [
                padded[:, i : i + sh * (out_h - 1) + 1 : sh, j : j + sw * (out_w - 1) + 1 : sw, :]
                for i in range(kh)
                for j in range(kw)
            ]
            patches = torch.cat(taps, dim=-1)
        out_h, out_w = patches.shape[1], patches.shape[2]
        out = self.product(patches.reshape(-1, patches.shape[-1]))
        # Back to NCHW indexing over channels-last memory: no copy.
        result: torch.Tensor = out.reshape(n, out_h, out_w, -1).permute(0, 3, 1, 2)
        return result


def convertible(layer: nn.Module, convs: str) -> bool:
    """Whether a layer can run as a low-precision product under the `lowp_convs` setting."""
    if isinstance(layer, nn.Linear):
        return layer.in_features % ALIGNMENT == 0
    if not isinstance(layer, nn.Conv2d) or convs == "none":
        return False
    plain = (
        layer.groups == 1
        and tuple(layer.dilation) == (1, 1)
        and not isinstance(layer.padding, str)
        and layer.padding_mode == "zeros"
    )
    k = layer.kernel_size[0] * layer.kernel_size[1]
    pointwise = tuple(layer.kernel_size) == (1, 1) and tuple(layer.padding) == (0, 0)
    aligned = (k * layer.in_channels) % ALIGNMENT == 0
    return plain and aligned and (pointwise or convs == "all")


def to_lowp(module: nn.Module, kind: Kind, convs: str = "pointwise") -> int:
    """Swap every convertible Linear (and convolution, per `convs`) in place; the count."""
    swapped = 0
    for name, child in list(module.named_children()):
        if not convertible(child, convs):
            swapped += to_lowp(child, kind, convs)
            continue
        if isinstance(child, nn.Linear):
            setattr(module, name, LowpLinear(child, kind))
        elif isinstance(child, nn.Conv2d):
            setattr(module, name, LowpConv2d(child, kind))
        swapped += 1
    return swapped


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """The module with each convolution's following BatchNorm folded into its weights.

    Eval-mode BatchNorm is an affine map per channel, so a convolution followed by one is one
    convolution with scaled weights and a bias: the same numbers, one pass less over memory.
    The pairs are found by tracing the module with torch.fx; a module that cannot be traced
    (data-dependent control flow) is returned as it is.
    """
    if not any(isinstance(m, nn.BatchNorm2d) for m in module.modules()):
        return module
    from torch.fx.experimental.optimization import fuse

    try:
        return fuse(module.eval())
    except Exception:  # torch.fx raises many kinds of errors for untraceable code
        return module
