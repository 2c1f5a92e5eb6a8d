"""ResNet-50 v1.5 written out by hand, layer for layer as torchvision's `resnet50`."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic


class Bottleneck(nn.Module):
    """1x1 → 3x3 → 1x1 with the stride on the 3x3 conv (the "v1.5" placement)."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)  # type: ignore[no-any-return]


class ResNet50(nn.Module):
    """ResNet-50: stem, four stages of (3, 4, 6, 3) bottlenecks, global pool, 1000-way FC."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_ch = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = []
            for i in range(blocks):
                layers.append(Bottleneck(in_ch, width, stride if i == 0 else 1))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]


def calibrate_batchnorm(model: nn.Module, images: np.ndarray) -> None:
    """Set every BatchNorm's running statistics to those of `images`, as training would.

    Untrained weights with the default statistics (mean 0, variance 1) let activations grow
    block after block until the logits are in the thousands; measured statistics keep every
    layer near unit scale, so the model behaves like a trained one under FP16 and INT8.
    """
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for batch in np.array_split(images, max(1, len(images) // 8)):
            model(torch.from_numpy(batch))
    model.eval()


def make(seed: int) -> tuple[nn.Module, Metadata]:
    """ResNet-50 with seeded He-normal weights and BatchNorm statistics from sample images."""
    from dlscale.models.zoo.samples import imagenet_like

    with deterministic(seed):
        model = ResNet50()
        calibrate_batchnorm(model, imagenet_like(8, np.random.default_rng(seed)))
    return model, {}
