"""A small CNN for scikit-learn's 8x8 digits, trained at build time in a few seconds on CPU."""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic
from dlscale.models.zoo.samples import digits_split

EPOCHS = 20
BATCH = 64
LEARNING_RATE = 3e-3


class DigitsCNN(nn.Module):
    """conv 16 → conv 32 → 2x2 max-pool → 64 → 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))  # type: ignore[no-any-return]


def train(seed: int) -> tuple[DigitsCNN, float]:
    """Train on the fixed split; returns the model and its held-out top-1 accuracy."""
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_split())
    with deterministic(seed) as generator:
        model = DigitsCNN()
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        model.train()
        for _ in range(EPOCHS):
            order = torch.randperm(len(y_train), generator=generator)
            for idx in torch.split(order, BATCH):
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
                torch.autograd.backward(loss)
                optimizer.step()
        model.eval()
        with torch.no_grad():
            top1 = (model(x_test).argmax(1) == y_test).double().mean().item()
    return model, top1


def make(seed: int) -> tuple[nn.Module, Metadata]:
    """The trained CNN, with its held-out accuracy for the config's metadata."""
    model, top1 = train(seed)
    return model, {"top1": round(top1, 4), "held_out": len(digits_split()[3])}
