"""The two smallest zoo models: an identity graph and a three-layer MLP."""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic


class MLP(nn.Module):
    """256 → 1024 → 1024 → 10 with ReLU between the layers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(256, 1024),
            nn.ReLU(),
            nn.Linear(1024, 1024),
            nn.ReLU(),
            nn.Linear(1024, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def make_identity(seed: int) -> tuple[nn.Module, Metadata]:
    """The identity model; it has no weights, and exports as one ONNX Identity node."""
    return nn.Identity().eval(), {}


def make_mlp(seed: int) -> tuple[nn.Module, Metadata]:
    """The MLP with PyTorch's default initialization drawn from `seed`."""
    with deterministic(seed):
        model = MLP()
    return model.eval(), {}


def make_conv_bn(seed: int) -> tuple[nn.Module, Metadata]:
    """A convolution, BatchNorm with running statistics away from 0 and 1, ReLU, a linear head:
    the smallest model whose answers change if BatchNorm folding goes wrong (input 3x8x8)."""
    with deterministic(seed):
        bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            for statistic, low, high in ((bn.running_mean, -0.5, 0.5), (bn.running_var, 0.5, 2.0)):
                assert statistic is not None  # track_running_stats, BatchNorm2d's default
                statistic.uniform_(low, high)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
        head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
        layers = [nn.Conv2d(3, 8, 3, padding=1), bn, nn.ReLU(), nn.AvgPool2d(2)]
        model = nn.Sequential(*layers, head)
    return model.eval(), {}
