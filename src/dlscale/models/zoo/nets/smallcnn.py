"""A small CNN over 64x64 RGB images of the zoo's synthetic classes: three strided 3x3 convolutions,
a global pool and a linear head fitted in closed form, 5.7 MFLOP per image.

It stands in for a classifier where what is measured is the pipeline around it (decode,
batching, hand-overs, labels) rather than two CPU cores' convolutions (docs/zoo.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic

#: The input side, and the size of the photo-shaped (4:3) images its head is fitted on: a
#: 375x500 photo resized to a shorter side of 64 is 64x85, and its centre crop is the input.
SIDE, FIT_WIDTH = 64, 85
#: Images per class the head is fitted on.
FIT_PER_CLASS = 4


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
    from dlscale.models.zoo.images import (
        IMAGE_CLASSES,
        IMAGENET_MEAN,
        IMAGENET_STD,
        class_intensities,
    )
    from dlscale.models.zoo.nets.resnet import fit_head

    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(IMAGE_CLASSES), FIT_PER_CLASS)
    left = (FIT_WIDTH - SIDE) // 2
    images = class_intensities(labels, rng, (SIDE, FIT_WIDTH))[..., left : left + SIDE]
    images = ((images - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32)
    with deterministic(seed):
        model = SmallCNN(IMAGE_CLASSES).eval()
        with torch.no_grad():
            features = model.body(torch.from_numpy(np.ascontiguousarray(images)))
        fit_head(model.fc, features, torch.from_numpy(labels), IMAGE_CLASSES)
    return model, {}
