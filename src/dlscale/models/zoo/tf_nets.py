"""The zoo's TensorFlow networks: Keras 3 models built from code with seeded weights.

Imported only when a TensorFlow entry is built or a test rebuilds one (it imports TensorFlow,
through `dlscale.backends.tensorflow.imports`, which loads Triton first: docs/backends.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlscale.backends.tensorflow.imports import keras
from dlscale.models.zoo.images import CROP_SIDE, IMAGE_CLASSES, centre_crops

#: The ridge fit of the head (as resnet.fit_head: one-hot targets scaled to this logit).
RIDGE, TARGET_LOGIT = 1e-2, 20.0
#: tf-text's vocabulary, sequence length, embedding width and classes.
VOCAB, TEXT_LEN, EMBED, TOPICS = 1000, 32, 32, 4


def image_classifier(seed: int) -> Any:
    """NHWC FP32 [64, 64, 3] "input" -> three strided 3x3 convolutions (16, 32, 64, ReLU) ->
    global average -> 32 "scores"; seeded body, head fitted to the synthetic classes."""
    keras.utils.set_random_seed(seed)
    pixels = keras.Input((CROP_SIDE, CROP_SIDE, 3), name="input")
    x = pixels
    for width in (16, 32, 64):
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
    features = keras.layers.GlobalAveragePooling2D(name="features")(x)
    scores = keras.layers.Dense(IMAGE_CLASSES, name="scores")(features)
    model = keras.Model(pixels, scores, name="tf_image")
    body = keras.Model(pixels, features)
    images, labels = centre_crops(seed)  # NCHW, as smallcnn's head is fitted on
    images = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    head = model.get_layer("scores")
    head.set_weights(_ridge(np.asarray(body(images, training=False)), labels))
    return model


def _ridge(features: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """[kernel, bias] of a dense head by ridge regression to one-hot targets, in float64
    (the dual form: fewer images than features would leave the primal singular)."""
    x = features.astype(np.float64)
    mean = x.mean(0)
    x -= mean
    targets = TARGET_LOGIT * np.eye(IMAGE_CLASSES)[labels]
    target_mean = targets.mean(0)
    gram = x @ x.T
    penalty = RIDGE * np.trace(gram) / len(gram)
    kernel = x.T @ np.linalg.solve(gram + penalty * np.eye(len(gram)), targets - target_mean)
    bias = target_mean - mean @ kernel
    return [kernel.astype(np.float32), bias.astype(np.float32)]


def text_classifier(seed: int) -> Any:
    """INT64 token ids [32] "input_ids" -> embedding (1000 x 32) -> mean over the sequence ->
    dense 64 (ReLU) -> 4 "scores"; seeded weights (the scores mean nothing: a serving model)."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((TEXT_LEN,), dtype="int64", name="input_ids")
    x = keras.layers.Embedding(VOCAB, EMBED, name="embedding")(ids)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    x = keras.layers.Dense(64, activation="relu", name="hidden")(x)
    scores = keras.layers.Dense(TOPICS, name="scores")(x)
    return keras.Model(ids, scores, name="tf_text")
