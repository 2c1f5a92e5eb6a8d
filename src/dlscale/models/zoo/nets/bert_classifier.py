"""A BERT sequence classifier: the zoo's BERT encoder and pooler, then a linear head over the
[CLS] token's pooled state, fitted in closed form to the zoo's topic corpus (zoo/text.py)."""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.zoo.nets.bert import Bert, BertConfig, init_weights
from dlscale.models.zoo.nets.common import deterministic


class BertClassifier(nn.Module):
    """(input_ids, attention_mask) -> logits [N, classes]."""

    def __init__(self, cfg: BertConfig, classes: int) -> None:
        super().__init__()
        self.bert = Bert(cfg)
        self.head = nn.Linear(cfg.hidden, classes)

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The pooler's output, what the head reads."""
        pooled: torch.Tensor = self.bert(input_ids, attention_mask)[1]
        return pooled

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.pooled(input_ids, attention_mask))  # type: ignore[no-any-return]


def make(
    seed: int, cfg: BertConfig, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> BertClassifier:
    """The classifier with seeded BERT weights and its head fitted to the labelled token rows."""
    from dlscale.models.zoo.nets.resnet import fit_head

    classes = int(labels.max()) + 1
    with deterministic(seed) as generator:
        model = BertClassifier(cfg, classes)
        init_weights(model, generator)
        model.eval()
        with torch.no_grad():
            features = torch.cat(
                [
                    model.pooled(i, m)
                    for i, m in zip(torch.split(ids, 16), torch.split(mask, 16), strict=True)
                ]
            )
        fit_head(model.head, features, labels, classes)
    return model
