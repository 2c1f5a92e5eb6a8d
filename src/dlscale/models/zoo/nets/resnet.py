"""ResNet-50 v1.5 written out by hand, layer for layer as torchvision's `resnet50`.

The body is seeded; the classifier head is fitted in closed form to the zoo's synthetic image
classes, so the model is as decisive on its own data as a trained one (docs/zoo.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic

#: Gain (BatchNorm weight) of the last BatchNorm in each residual branch: torchvision starts it
#: at 1, or at 0 with `zero_init_residual`; at 1 the seeded network is chaotic (docs/zoo.md).
RESIDUAL_GAIN = 0.2
#: Images per synthetic class the head is fitted on, and how many run through BatchNorm first.
HEAD_IMAGES_PER_CLASS = 1
BATCHNORM_IMAGES = 8
#: Ridge penalty, relative to the mean squared norm of the centred features.
RIDGE = 1e-2
#: The logit the head is fitted to give an image's own class (0 for the other classes).
TARGET_LOGIT = 20.0
#: Bias of the classes no image belongs to, well below the fitted ones.
UNUSED_BIAS = -TARGET_LOGIT / 2


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
            elif isinstance(m, Bottleneck):
                nn.init.constant_(m.bn3.weight, RESIDUAL_GAIN)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled 2048-wide features the classifier head reads."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))  # type: ignore[no-any-return]


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


def fit_head(fc: nn.Linear, features: torch.Tensor, labels: torch.Tensor, classes: int) -> None:
    """Fit `fc`'s first `classes` rows by ridge regression to one-hot targets, in float64.

    Closed form in the dual (fewer images than features): W = Xᵀ(XXᵀ + λI)⁻¹Y on centred X
    and Y. The other rows keep their seeded weights and get a low bias.
    """
    x = features.double()
    mean = x.mean(0)
    x = x - mean
    targets = TARGET_LOGIT * nn.functional.one_hot(labels, classes).double()
    target_mean = targets.mean(0)
    gram = x @ x.T
    penalty = RIDGE * torch.trace(gram) / len(gram)
    eye = torch.eye(len(gram), dtype=torch.float64)
    weight = x.T @ torch.linalg.solve(gram + penalty * eye, targets - target_mean)
    with torch.no_grad():
        fc.weight[:classes] = weight.T.float()
        fc.bias[:classes] = (target_mean - mean @ weight).float()
        fc.bias[classes:] = UNUSED_BIAS


def make(seed: int) -> tuple[nn.Module, Metadata]:
    """ResNet-50: seeded body, BatchNorm statistics and the head fitted on synthetic classes."""
    from dlscale.models.zoo.images import IMAGE_CLASSES, class_images, labelled_images

    rng = np.random.default_rng(seed)
    with deterministic(seed):
        model = ResNet50()
        calibrate_batchnorm(model, labelled_images(BATCHNORM_IMAGES, rng)[0])
        labels = np.tile(np.arange(IMAGE_CLASSES), HEAD_IMAGES_PER_CLASS)
        images = class_images(labels, rng)
        with torch.no_grad():
            batches = np.array_split(images, max(1, len(images) // 8))
            features = torch.cat([model.features(torch.from_numpy(b)) for b in batches])
        fit_head(model.fc, features, torch.from_numpy(labels), IMAGE_CLASSES)
    return model, {}
