"""The BERT-base encoder written out by hand, parameter for parameter as Hugging Face's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dlscale.models.zoo.nets.common import Metadata, deterministic

#: Added to the attention scores of padding tokens. Original BERT's -10000 rather than the
#: float32 minimum, so that the graph stays finite when converted to FP16.
MASKED_SCORE = -10000.0


@dataclass(frozen=True)
class BertConfig:
    """BERT-base hyper-parameters (bert-base-uncased)."""

    vocab_size: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, then LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Positions 0..S-1 counted along each row rather than sliced from the table: a Slice up
        # to a length read from the input's shape leaves ONNX shape inference without a shape.
        positions = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
        # Single-segment inputs: every token has type 0, so its embedding is one shared row.
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])  # type: ignore[no-any-return]


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention with an additive padding mask."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # [N, S, hidden] → [N, heads, S, head_dim], written as Hugging Face's BERT is so that
        # ONNX Runtime's transformer optimizer recognizes the attention pattern.
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        context = torch.softmax(scores, dim=-1) @ v
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], self.heads * self.head_dim)


class Layer(nn.Module):
    """One encoder layer: attention and feed-forward, each with a residual and post-LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_output = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention_output(self.attention(x, mask)))
        hidden = nn.functional.gelu(self.intermediate(x))  # exact (erf) GELU, as BERT
        return self.output_norm(x + self.output(hidden))  # type: ignore[no-any-return]


class Bert(nn.Module):
    """Encoder plus pooler; returns (last_hidden_state, pooler_output)."""

    def __init__(self, cfg: BertConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or BertConfig()
        self.embeddings = Embeddings(cfg)
        self.encoder = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embeddings(input_ids)
        # [N, S] of 1 (attend) / 0 (padding) → [N, 1, 1, S] of 0 / MASKED_SCORE, added to scores
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASKED_SCORE
        for layer in self.encoder:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """BERT's initializer (normal, std 0.02), with biases and LayerNorm affine drawn too.

    Trained models have non-zero biases and LayerNorm gains away from one; drawing them makes
    an exporter or runtime that drops or misplaces one of them show in the outputs.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                m.weight.normal_(0.0, 0.02, generator=generator)
            if isinstance(m, nn.Linear):
                m.bias.normal_(0.0, 0.02, generator=generator)
            elif isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.1, generator=generator)
                m.bias.normal_(0.0, 0.02, generator=generator)


def make(seed: int) -> tuple[nn.Module, Metadata]:
    """BERT-base with seeded weights."""
    with deterministic(seed) as generator:
        model = Bert()
        init_weights(model, generator)
    return model.eval(), {}
