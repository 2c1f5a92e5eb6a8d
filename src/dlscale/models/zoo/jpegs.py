"""A synthetic photo set made by code: the zoo's image classes at photo size, JPEG-encoded.

The images are those the zoo's image models were fitted on (`images.class_intensities`), drawn
at 375x500 (the median ImageNet photo is about that size) and encoded with libjpeg-turbo
(`simplejpeg`), so a pipeline that takes JPEG bytes is fed what a camera or a browser sends,
offline and the same on every machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlscale.models.zoo.images import IMAGE_CLASSES, class_intensities

#: libjpeg's quality: 90 keeps the synthetic patterns' edges and costs 20-60 KB per 375x500.
QUALITY = 90
#: Images drawn per call to the pattern generator: bounds its memory (12 B per pixel).
CHUNK = 16


def synthetic_pixels(
    count: int, seed: int = 0, size: tuple[int, int] = (375, 500)
) -> tuple[np.ndarray, np.ndarray]:
    """UINT8 [count, height, width, 3] RGB images of classes drawn from `seed`, and the classes."""
    if count < 0 or min(size) < 1:
        raise ValueError(f"need count >= 0 and a positive size, got {count} and {size}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, IMAGE_CLASSES, size=count)
    pixels = np.empty((count, *size, 3), np.uint8)
    for start in range(0, count, CHUNK):
        chunk = class_intensities(labels[start : start + CHUNK], rng, size)
        levels = np.rint(chunk.transpose(0, 2, 3, 1) * 255.0)
        pixels[start : start + CHUNK] = levels.astype(np.uint8)
    return pixels, labels.astype(np.int64)


def encode_jpeg(pixels: np.ndarray, quality: int = QUALITY) -> bytes:
    """One UINT8 [height, width, 3] RGB image as JPEG bytes (4:2:0, as cameras write)."""
    import simplejpeg

    data: bytes = simplejpeg.encode_jpeg(
        np.ascontiguousarray(pixels), quality=quality, colorspace="RGB", colorsubsampling="420"
    )
    return data


def synthetic_jpegs(count: int, seed: int = 0, size: tuple[int, int] = (375, 500)) -> list[bytes]:
    """`count` JPEG-encoded synthetic photos (height, width = `size`), the same for a seed."""
    pixels, _ = synthetic_pixels(count, seed, size)
    return [encode_jpeg(image) for image in pixels]


def write_jpegs(
    folder: Path, count: int, seed: int = 0, size: tuple[int, int] = (375, 500)
) -> list[Path]:
    """Write the set to `folder` as 00000.jpg, 00001.jpg, ...; returns the files' paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(synthetic_jpegs(count, seed, size)):
        path = folder / f"{i:05d}.jpg"
        path.write_bytes(data)
        paths.append(path)
    return paths
