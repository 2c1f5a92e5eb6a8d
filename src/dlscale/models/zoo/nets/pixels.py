"""A zoo image model behind its pixel normalization: UINT8 pixels in, normalized on the device."""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata


class PixelInput(nn.Module):
    """(pixels / scale - mean) / std per channel, as one multiply-add, then the model.

    The pixels cross PCIe as one byte each and become floating point on the device; the
    multiply-add follows the model's dtype (its buffers are cast with it) and, compiled, fuses
    into the first layer's input read.
    """

    gain: torch.Tensor
    offset: torch.Tensor

    def __init__(self, model: nn.Module, scale: float, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        mean_t = torch.tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        std_t = torch.tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        self.register_buffer("gain", 1.0 / (scale * std_t))
        self.register_buffer("offset", -mean_t / std_t)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # Type promotion makes UINT8 x gain the gain's dtype (the model's, once it is cast);
        # no dtype is read here, so a traced graph (torch.fx, export) keeps following it.
        images = pixels * self.gain + self.offset
        return self.model(images)  # type: ignore[no-any-return]


def make(model: str, seed: int) -> tuple[nn.Module, Metadata]:
    """The zoo model called `model` (weights from `seed`) taking UINT8 pixels."""
    from dlscale.models.zoo.catalog import ZOO
    from dlscale.models.zoo.inputs import PIXELS

    pixels = PIXELS[model]
    module, metadata = ZOO[model].factory_module(seed)
    wrapped = PixelInput(module, pixels.scale, list(pixels.mean), list(pixels.std))
    return wrapped.eval(), metadata
