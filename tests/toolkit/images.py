"""Images for the processing-step tests: real ones from the zoo's synthetic set, encoded with the
libraries a client would use, and hostile ones (truncated, bombs, not images at all)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import simplejpeg
from PIL import Image

from dlscale.models.zoo.images import IMAGENET_MEAN, IMAGENET_STD
from dlscale.models.zoo.jpegs import synthetic_pixels

#: The smallcnn-e2e image step's settings, which the tests' references follow.
RESIZE, CROP = 73, 64


def png(pixels: np.ndarray) -> bytes:
    """UINT8 [h, w, 3] RGB as PNG bytes (Pillow)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def photos(count: int, seed: int) -> np.ndarray:
    """UINT8 [count, 375, 500, 3] synthetic photos."""
    return synthetic_pixels(count, seed)[0]


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_bomb(side: int) -> bytes:
    """A PNG of a few hundred bytes whose header claims side x side RGB pixels: decoded, it
    would take 3 * side**2 bytes (a decompression bomb)."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    # One compressed row of zeros; the decoder would ask for the rest, which is all zeros.
    data = zlib.compress(b"\x00" * (1 + 3 * min(side, 1024)), 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", data)
        + _chunk(b"IEND", b"")
    )


def jpeg_bomb(side: int) -> bytes:
    """A small real JPEG whose frame header (SOF0) is rewritten to claim side x side pixels."""
    data = bytearray(simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8), colorspace="RGB"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def reference_pixels(data: bytes, resize: int = RESIZE, side: int = CROP) -> np.ndarray:
    """FP32 [3, side, side] as a client would prepare them by hand: the full decode
    (simplejpeg), the shorter side resized to `resize` (Pillow, bilinear), the centre crop,
    ImageNet's normalization."""
    rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")
    height, width = rgb.shape[:2]
    scale = resize / min(height, width)
    size = (round(width * scale), round(height * scale))
    image = Image.fromarray(rgb).resize(size, Image.Resampling.BILINEAR)
    left, top = (size[0] - side) // 2, (size[1] - side) // 2
    crop = np.asarray(image.crop((left, top, left + side, top + side)), np.float32) / 255
    normalized: np.ndarray = (crop.transpose(2, 0, 1) - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    return normalized.astype(np.float32)


def top_indices(labels: np.ndarray) -> list[list[int]]:
    """The class indices of rows of "score:index:label" strings."""
    return [[int(item.decode().split(":")[1]) for item in row] for row in labels]
