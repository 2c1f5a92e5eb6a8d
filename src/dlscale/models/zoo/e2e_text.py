"""bert-e2e: text in, its topic out. The tokenizer step (a WordPiece vocabulary trained by code),
a BERT classifier whose head is fitted to the same corpus, and a top-1 step with the topics'
names (docs/zoo.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlscale.models.zoo.model import WEIGHT_SEED
from dlscale.models.zoo.steps import write_pipeline, write_step, write_topk
from dlscale.models.zoo.text import CLASSES, sentences, train_tokenizer
from dlscale.types import Datatype, TensorSpec

if TYPE_CHECKING:
    from dlscale.models.zoo.nets.bert import BertConfig

#: Tokens per text (the classifier's sequence length): the corpus's sentences take at most 16.
MAX_LENGTH = 32
TEXT_BATCH = 64
#: Sentences the classifier's head is fitted on (a seed apart from the tokenizer's corpus).
FIT_SENTENCES, FIT_SEED = 192, 11


def text_signature() -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The text pipelines' tensors: one UTF-8 text per row in, its class out."""
    return (
        [TensorSpec("text", Datatype.BYTES, (1,))],
        [TensorSpec("class", Datatype.BYTES, (1,))],
    )


def tokenize(tokenizer_json: str, texts: list[str]) -> dict[str, np.ndarray]:
    """INT64 input_ids and attention_mask [len(texts), MAX_LENGTH], as the tokenizer step makes."""
    from tokenizers import Tokenizer

    encodings = Tokenizer.from_str(tokenizer_json).encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
    }


def text_pipeline(root: Path, name: str, cfg: BertConfig | None = None) -> None:
    """Write `name` (text -> `name`-tokenizer -> `name`-classifier -> `name`-topk -> class)."""
    import torch

    from dlscale.models.zoo.export import export_onnx
    from dlscale.models.zoo.nets.bert import BertConfig
    from dlscale.models.zoo.nets.bert_classifier import make

    tokenizer_json = train_tokenizer(MAX_LENGTH)
    write_step(
        root,
        f"{name}-tokenizer",
        "tokenizer",
        TEXT_BATCH,
        {"max_length": MAX_LENGTH},
        {"tokenizer.json": tokenizer_json.encode()},
    )
    texts, labels = sentences(FIT_SENTENCES, FIT_SEED)
    tokens = tokenize(tokenizer_json, texts)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_str(tokenizer_json).get_vocab_size()
    config = dataclasses.replace(cfg or BertConfig(), vocab_size=vocab)
    ids, mask = (torch.from_numpy(tokens[k]) for k in ("input_ids", "attention_mask"))
    model = make(WEIGHT_SEED, config, ids, mask, torch.from_numpy(labels))
    example = {k: v[:2] for k, v in tokens.items()}
    proto = export_onnx(model, example, ["logits"])
    token_specs = [TensorSpec(k, Datatype.INT64, (MAX_LENGTH,)) for k in tokens]
    logits = TensorSpec("logits", Datatype.FP32, (len(CLASSES),))
    write_step(
        root,
        f"{name}-classifier",
        "onnxruntime",
        TEXT_BATCH,
        {},
        {"model.onnx": proto.SerializeToString()},
        (token_specs, [logits]),
    )
    write_topk(root, f"{name}-topk", TEXT_BATCH, 1, CLASSES)
    tokens_map = {k: k for k in tokens}
    write_pipeline(
        root,
        name,
        TEXT_BATCH,
        text_signature(),
        [
            (f"{name}-tokenizer", {"text": "text"}, tokens_map),
            (f"{name}-classifier", tokens_map, {"logits": "logits"}),
            (f"{name}-topk", {"scores": "logits"}, {"labels": "class"}),
        ],
        {"zoo": "true", "task": "text classification", "classes": ",".join(CLASSES)},
    )
