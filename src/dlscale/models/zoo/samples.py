"""Realistic inputs for the zoo's models, made with numpy alone (no torch import)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dlscale.models.zoo.images import labelled_images
from dlscale.models.zoo.model import CALIBRATION_SEED, VALIDATION_SEED

#: bert-base-uncased's vocabulary size and special token ids.
BERT_VOCAB = 30522
CLS_ID, SEP_ID, PAD_ID = 101, 102, 0
#: Word pieces proper start here; the ids below are [unused] slots and punctuation.
FIRST_WORD_ID = 1996

#: The digits split: the same seed and size in every build.
DIGITS_SEED = 0
DIGITS_HELD_OUT = 360

#: resnet50's calibration and validation sets (validation images come with their labels).
IMAGE_CALIBRATION, IMAGE_VALIDATION = 16, 64


def gaussian(batch: int, rng: np.random.Generator, width: int) -> np.ndarray:
    """Standard-normal FP32 features of shape [batch, width]."""
    return rng.standard_normal((batch, width), dtype=np.float32)


def imagenet_like(batch: int, rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """FP32 [batch, 3, size, size] images of the synthetic classes, ImageNet-normalized.

    Each image is one class's smooth pattern (colour waves, a grating, blobs), shifted and
    recoloured a little, with noise at three scales; see `images.class_images`.
    """
    return labelled_images(batch, rng, size)[0]


def image_sets() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """resnet50's calibration images, validation images and validation labels (INT64).

    The same in every build: drawn from the zoo's calibration and validation seeds.
    """
    calibration = imagenet_like(IMAGE_CALIBRATION, np.random.default_rng(CALIBRATION_SEED))
    images, labels = labelled_images(IMAGE_VALIDATION, np.random.default_rng(VALIDATION_SEED))
    return calibration, images, labels


def bert_tokens(batch: int, rng: np.random.Generator, seq_len: int = 128) -> dict[str, np.ndarray]:
    """INT64 `input_ids` and `attention_mask` [batch, seq_len] shaped like tokenized text.

    Each row is `[CLS] words... [SEP]` then padding, its length drawn between seq_len / 8 and
    seq_len; word ids follow a Zipf law over the vocabulary, as word frequencies do.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2 ([CLS] and [SEP]), got {seq_len}")
    lengths = rng.integers(max(2, seq_len // 8), seq_len + 1, size=batch)
    words = BERT_VOCAB - FIRST_WORD_ID
    ids = FIRST_WORD_ID + (rng.zipf(1.3, size=(batch, seq_len)) - 1) % words
    mask = np.arange(seq_len)[None, :] < lengths[:, None]
    ids[:, 0] = CLS_ID
    ids[np.arange(batch), lengths - 1] = SEP_ID
    ids[~mask] = PAD_ID
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}


@lru_cache(maxsize=1)
def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as FP32 [N, 1, 8, 8] in [0, 1]: (x_train, y_train, x_test, y_test).

    The split is fixed (seed 0, 360 held out), so every build trains and scores on the same
    images. Needs scikit-learn, which ships the data set.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(DIGITS_SEED).permutation(len(labels))
    test, train = order[:DIGITS_HELD_OUT], order[DIGITS_HELD_OUT:]
    return images[train], labels[train], images[test], labels[test]


def digits_images(batch: int, rng: np.random.Generator) -> np.ndarray:
    """Real held-out digit images, FP32 [batch, 1, 8, 8] in [0, 1], drawn with replacement."""
    _, _, x_test, _ = digits_split()
    return x_test[rng.integers(0, len(x_test), size=batch)]
