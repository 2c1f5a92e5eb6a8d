"""Synthetic image classes for resnet50: fixed smooth patterns, each image one of them jittered."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: torchvision's ImageNet normalization, per RGB channel.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)

#: How many classes there are, and the seed of their patterns (the same in every build).
IMAGE_CLASSES = 32
PATTERN_SEED = 1000
#: Per class: low-frequency colour waves, one grating and a few blobs.
WAVES, BLOBS = 4, 2
#: Per image: shift (image widths, std), contrast range, colour cast (std), noise per scale.
SHIFT, CONTRAST, CAST = 0.02, (0.9, 1.1), 0.02
NOISE = (0.06, 0.04, 0.025)


@dataclass(frozen=True)
class Patterns:
    """The parameters of every class's pattern, arrays with the class first."""

    #: [K, WAVES + 1, 2] spatial frequencies (cycles per image); the last wave is the grating.
    freq: np.ndarray
    #: [K, WAVES + 1] phases and [K, WAVES + 1, 3] RGB amplitudes.
    phase: np.ndarray
    wave_rgb: np.ndarray
    #: [K, BLOBS, 2] centres (in image widths), [K, BLOBS] radii, [K, BLOBS, 3] RGB amplitudes.
    centre: np.ndarray
    radius: np.ndarray
    blob_rgb: np.ndarray


@lru_cache(maxsize=1)
def patterns() -> Patterns:
    """The class patterns, drawn once from PATTERN_SEED."""
    rng = np.random.default_rng(PATTERN_SEED)
    k = IMAGE_CLASSES
    angle = rng.uniform(0, 2 * np.pi, (k, WAVES + 1))
    cycles = np.concatenate(
        [rng.uniform(0.3, 1.5, (k, WAVES)), rng.uniform(3.0, 10.0, (k, 1))], axis=1
    )
    freq = cycles[..., None] * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    wave_rgb = rng.uniform(-1, 1, (k, WAVES + 1, 3)) * np.array([0.15] * WAVES + [0.1])[:, None]
    return Patterns(
        freq=freq,
        phase=rng.uniform(0, 2 * np.pi, (k, WAVES + 1)),
        wave_rgb=wave_rgb,
        centre=rng.uniform(0.2, 0.8, (k, BLOBS, 2)),
        radius=rng.uniform(0.06, 0.18, (k, BLOBS)),
        blob_rgb=rng.uniform(-0.35, 0.35, (k, BLOBS, 3)),
    )


def class_images(labels: np.ndarray, rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """FP32 [N, 3, size, size] images of the given classes, ImageNet-normalized.

    Each is its class's pattern shifted a little, with its own contrast and colour cast, and
    with multi-scale noise on top (coarse blobs, mid-scale texture, fine grain), so that
    neighbouring pixels correlate as in photographs and no two images are alike.
    """
    img = class_intensities(labels, rng, (size, size))
    normalized: np.ndarray = (img - IMAGENET_MEAN) / IMAGENET_STD
    return normalized


def class_intensities(
    labels: np.ndarray, rng: np.random.Generator, size: tuple[int, int]
) -> np.ndarray:
    """FP32 [N, 3, height, width] images of the given classes, intensities in [0, 1]."""
    n = len(labels)
    shift = rng.normal(0.0, SHIFT, (n, 2))
    colours, rows, cols = _pattern_terms(labels, shift, size)
    # Every term is a colour times a separable field rows[y] * cols[x]. einsum's own loop (no
    # BLAS) sums them in a fixed order, so the pixels do not depend on the thread count.
    img = np.einsum("ntc,nty,ntx->ncyx", colours, rows, cols)
    contrast = rng.uniform(*CONTRAST, (n, 1, 1, 1)).astype(np.float32)
    cast = rng.normal(0.0, CAST, (n, 3, 1, 1)).astype(np.float32)
    img = 0.5 + contrast * img + cast + _noise(n, rng, size)
    np.clip(img, 0.0, 1.0, out=img)
    intensities: np.ndarray = img
    return intensities


def _pattern_terms(
    labels: np.ndarray, shift: np.ndarray, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The classes' patterns as sums of separable terms: colours [n,T,3], rows and cols [n,T,size].

    A wave sin(a(x) + b(y)) is sin(a)cos(b) + cos(a)sin(b); a Gaussian blob is a product too.
    """
    p = patterns()
    # The pattern spans the image's width; a taller or shorter image shows more or less of it
    # vertically, at the same scale (square pixels).
    height, width = size
    x = ((np.arange(width) + 0.5) / width)[None, None, :] - shift[:, 0, None, None]  # [n, 1, W]
    y = ((np.arange(height) + 0.5 - (height - width) / 2) / width)[None, None, :]
    y = y - shift[:, 1, None, None]
    freq, phase = p.freq[labels], p.phase[labels]  # [n, W, 2], [n, W]
    ax = 2 * np.pi * freq[:, :, 0, None] * x + phase[:, :, None]  # [n, W, size]
    ay = 2 * np.pi * freq[:, :, 1, None] * y
    centre, radius = p.centre[labels], p.radius[labels][:, :, None]  # [n, B, 2], [n, B, 1]
    bx = np.exp(-((x - centre[:, :, 0, None]) ** 2) / (2 * radius**2))
    by = np.exp(-((y - centre[:, :, 1, None]) ** 2) / (2 * radius**2))
    wave_rgb, blob_rgb = p.wave_rgb[labels], p.blob_rgb[labels]
    colours = np.concatenate([wave_rgb, wave_rgb, blob_rgb], axis=1)
    rows = np.concatenate([np.cos(ay), np.sin(ay), by], axis=1)
    cols = np.concatenate([np.sin(ax), np.cos(ax), bx], axis=1)
    f32 = np.float32
    return colours.astype(f32), rows.astype(f32), cols.astype(f32)


def _noise(n: int, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """Zero-mean noise at three scales: cells of 32 and 8 pixels (7x7 and 28x28 at 224), and
    single pixels."""
    height, width = size
    noise = np.zeros((n, 3, height, width), np.float32)
    for scale, weight in zip((32, 8, 1), NOISE, strict=True):
        cells = (n, 3, -(-height // scale), -(-width // scale))
        cell = weight * (rng.random(cells, dtype=np.float32) - 0.5)
        noise += cell.repeat(scale, axis=2).repeat(scale, axis=3)[:, :, :height, :width]
    return noise


def labelled_images(
    batch: int, rng: np.random.Generator, size: int = 224
) -> tuple[np.ndarray, np.ndarray]:
    """`batch` images of classes drawn uniformly, and their INT64 labels."""
    labels = rng.integers(0, IMAGE_CLASSES, size=batch)
    return class_images(labels, rng, size), labels.astype(np.int64)


#: The photo-shaped (4:3) images the 64x64 classifiers' heads are fitted on (smallcnn's and
#: tf-image's): a 375x500 photo resized to a shorter side of 64 is 64x85, and its centre crop is
#: the input. So many images of each class.
CROP_SIDE, CROP_WIDTH, CROPS_PER_CLASS = 64, 85, 4


def centre_crops(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """FP32 [N, 3, 64, 64] ImageNet-normalized centre crops of photo-shaped images,
    CROPS_PER_CLASS of each class, drawn from `seed`; and their INT64 labels."""
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(IMAGE_CLASSES), CROPS_PER_CLASS)
    left = (CROP_WIDTH - CROP_SIDE) // 2
    images = class_intensities(labels, rng, (CROP_SIDE, CROP_WIDTH))[..., left : left + CROP_SIDE]
    normalized: np.ndarray = (images - IMAGENET_MEAN) / IMAGENET_STD
    return normalized, labels
