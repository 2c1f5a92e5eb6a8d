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
