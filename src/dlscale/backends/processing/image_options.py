"""The image step's settings ([backend_options]) and the arithmetic both its CPU and its CUDA
paths apply: the geometry of resize and crop, and the per-channel normalization."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from dlscale.backends.processing.decode import Geometry
from dlscale.backends.processing.options import StepOptions
from dlscale.errors import ConfigError


class ImageOptions(StepOptions):
    """The image step's [backend_options] (docs/processing.md)."""

    #: The shorter side after resizing (0: none, the crop is cut from the decoded image).
    resize: int = Field(256, ge=0, le=8192)
    #: The centre crop: one side (square) or [height, width].
    crop: int | list[int] = 224
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dtype: Literal["FP32", "FP16", "UINT8"] = "FP32"
    channel_order: Literal["RGB", "BGR"] = "RGB"
    #: Per channel (in the output's channel order), on intensities in [0, 1]; floating only.
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0], min_length=3, max_length=3)
    std: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0], min_length=3, max_length=3)
    #: Bounds on each image, checked before decoding: encoded bytes and decoded pixels.
    max_bytes: int = Field(16 * 2**20, ge=1)
    max_pixels: int = Field(40_000_000, ge=1)
    #: On a CUDA device: hand the pixels to the next step of a pipeline in device memory (a
    #: CuPy array), for a next step that reads device buffers on the same GPU (the torch
    #: backend there); false: they come back to the host.
    device_output: bool = False
    #: Decode threads per instance (0: min(4, CPUs)).
    threads: int = Field(0, ge=0, le=64)

    def geometry(self) -> Geometry:
        """The resize, crop and bounds; a ConfigError for a crop that cannot be."""
        crop = [self.crop, self.crop] if isinstance(self.crop, int) else list(self.crop)
        if len(crop) != 2 or not all(1 <= c <= 8192 for c in crop):
            raise ConfigError(
                f"image step: crop must be a side or [height, width] in 1..8192, got {self.crop}"
            )
        if self.resize and max(crop) > self.resize:
            raise ConfigError(
                f"image step: crop {crop} is larger than the resized shorter side {self.resize}"
            )
        return Geometry(self.resize, (crop[0], crop[1]), self.max_bytes, self.max_pixels)


def normalization(settings: ImageOptions) -> tuple[np.ndarray, np.ndarray]:
    """(gain, offset) per channel with `pixels * gain + offset == (pixels / 255 - mean) / std`,
    shaped to broadcast over one image in the output's layout."""
    mean = np.asarray(settings.mean, np.float32)
    std = np.asarray(settings.std, np.float32)
    shape = (3, 1, 1) if settings.layout == "NCHW" else (1, 1, 3)
    gain = (1.0 / (255.0 * std)).reshape(shape)
    offset = (-mean / std).reshape(shape)
    return gain, offset
