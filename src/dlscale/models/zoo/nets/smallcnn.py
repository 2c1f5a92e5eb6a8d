"""A small CNN over 64x64 RGB images of the zoo's synthetic classes: three strided 3x3 convolutions,
a global pool and a linear head fitted in closed form, 5.7 MFLOP per image.

It stands in for a classifier where what is measured is the pipeline around it (decode,
batching, hand-overs, labels) rather than two CPU cores' convolutions (docs/zoo.md).
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic


class SmallCNN(nn.Module):
    """conv 16 → conv 32 → conv 64 (each 3x3, stride 2, ReLU) → global average → classes."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, 16), (16, 32), (32, 64)):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))  # type: ignore[no-any-return]


def make(seed: int) -> tuple[nn.Module, Metadata]:
    """The CNN: seeded convolutions, the head fitted to the synthetic classes' centre crops."""
    from dlscale.models.zoo.images import IMAGE_CLASSES, centre_crops
    from dlscale.models.zoo.nets.resnet import fit_head

    images, labels = centre_crops(seed)
    with deterministic(seed):
        model = SmallCNN(IMAGE_CLASSES).eval()
        with torch.no_grad():
            features = model.body(torch.from_numpy(images))
        fit_head(model.fc, features, torch.from_numpy(labels), IMAGE_CLASSES)
    return model, {}
