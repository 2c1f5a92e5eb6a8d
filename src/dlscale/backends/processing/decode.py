"""Decoding one encoded image on the CPU, bounded before any pixel is made.

JPEG goes through libjpeg-turbo (`simplejpeg`), with its DCT-domain downscaling when the target
is at most half the image's size (the decoder then computes a quarter or fewer of the pixels);
PNG and the other formats through Pillow. Resize and centre crop are one Pillow resample of the
crop's source box (bilinear with antialiasing), so only the pixels kept are computed. Both
libraries release the GIL while they decode and resample, so rows decode in parallel threads.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dlscale.errors import InvalidInput, PayloadTooLarge

if TYPE_CHECKING:
    from PIL.Image import Image as Picture

JPEG_MAGIC = b"\xff\xd8\xff"
#: Formats other than JPEG that Pillow may open: lossless ones clients send; never a format
#: whose decoder runs code or fetches files (EPS, SVG are not in Pillow's list anyway).
OTHER_FORMATS = ("PNG", "WEBP", "BMP", "GIF", "TIFF")


@dataclass(frozen=True)
class Geometry:
    """What every decoded image becomes: shorter side resized, then centre-cropped."""

    #: The shorter side's length after resizing; 0: no resize (the crop is cut from the image).
    resize: int
    #: The crop's (height, width).
    crop: tuple[int, int]
    #: Bounds checked on each image before it is decoded.
    max_bytes: int
    max_pixels: int

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The image's size after resizing its shorter side to `resize`."""
        if not self.resize:
            return height, width
        scale = self.resize / min(height, width)
        return max(self.resize, round(height * scale)), max(self.resize, round(width * scale))


def check_size(data: bytes, geometry: Geometry) -> None:
    """PayloadTooLarge for an image larger than max_bytes; InvalidInput for an empty one."""
    if len(data) > geometry.max_bytes:
        raise PayloadTooLarge(
            f"is {len(data)} bytes encoded, above the step's max_bytes ({geometry.max_bytes})"
        )
    if not data:
        raise InvalidInput("is empty (0 bytes)")


def check_pixels(height: int, width: int, geometry: Geometry) -> None:
    """Refuse, from its header, an image whose pixels exceed the bound (a decompression bomb:
    a few KB that would decode to gigabytes) or that is smaller than the crop."""
    if height * width > geometry.max_pixels:
        raise PayloadTooLarge(
            f"is {width}x{height} pixels, above the step's max_pixels ({geometry.max_pixels}); "
            "refused before decoding"
        )
    rows, cols = geometry.resized(height, width)
    if rows < geometry.crop[0] or cols < geometry.crop[1]:
        raise InvalidInput(
            f"is {width}x{height} pixels, smaller than the {geometry.crop[1]}x"
            f"{geometry.crop[0]} crop"
        )


def decode_rgb(data: bytes, geometry: Geometry) -> np.ndarray:
    """One encoded image as UINT8 [crop height, crop width, 3] RGB, resized and cropped."""
    from PIL import Image

    check_size(data, geometry)
    if data.startswith(JPEG_MAGIC):
        return _resize_and_crop(Image.fromarray(_decode_jpeg(data, geometry)), geometry)
    return _resize_and_crop(_open_other(data, geometry), geometry)


def jpeg_size(data: bytes) -> tuple[int, int]:
    """A JPEG's (height, width) from its frame header, without decoding it."""
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise InvalidInput(f"is not a readable JPEG ({exc})") from None
    return height, width


#: A JPEG's start-of-scan and end-of-image markers. A 0xFF byte in compressed data is always
#: followed by 0x00 (or a restart marker, 0xD0-0xD7), so neither pair occurs inside a scan.
_START_OF_SCAN, _END_OF_IMAGE = b"\xff\xda", b"\xff\xd9"


def check_complete(data: bytes) -> None:
    """InvalidInput for a JPEG cut short: no end-of-image marker after its last scan.

    The CPU decoder is strict and refuses such a file; nvJPEG decodes what arrived and fills the
    rest, so the device path checks first and a truncated upload gets the same 400 on either.
    """
    if data.rfind(_END_OF_IMAGE) < data.rfind(_START_OF_SCAN):
        raise InvalidInput(
            "is not a decodable JPEG (Premature end of JPEG file: no end-of-image marker after "
            "its last scan)"
        )


def _decode_jpeg(data: bytes, geometry: Geometry) -> np.ndarray:
    import simplejpeg

    height, width = jpeg_size(data)
    check_pixels(height, width, geometry)
    rows, cols = geometry.resized(height, width)
    want = (rows, cols) if geometry.resize else (height, width)
    try:
        # The decoder downscales by 1/2, 1/4 or 1/8 in the DCT as long as the result keeps at
        # least the size the resize needs; strict: a truncated or corrupt file is an error.
        pixels: np.ndarray = simplejpeg.decode_jpeg(
            data, colorspace="RGB", min_height=want[0], min_width=want[1], strict=True
        )
    except ValueError as exc:
        raise InvalidInput(f"is not a decodable JPEG ({exc})") from None
    return pixels


def _open_other(data: bytes, geometry: Geometry) -> Picture:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns; ours (check_pixels) refuses first, with a reason.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=OTHER_FORMATS)
            check_pixels(image.height, image.width, geometry)
            image.load()
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise InvalidInput(
            f"is not an image in a known format (JPEG, {', '.join(OTHER_FORMATS)}); "
            f"it starts with {data[:8]!r}"
        ) from None
    except Image.DecompressionBombError as exc:
        raise PayloadTooLarge(f"is refused before decoding ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput(f"cannot be decoded ({exc})") from None


def _resize_and_crop(image: Picture, geometry: Geometry) -> np.ndarray:
    """The centre crop of the resized image, resampled from its source box in one pass (or,
    without a resize, cut out pixel for pixel)."""
    from PIL import Image

    width, height = image.size
    rows, cols = geometry.resized(height, width)
    crop_h, crop_w = geometry.crop
    if (rows, cols) == (height, width):
        top, left = (height - crop_h) // 2, (width - crop_w) // 2
        return np.asarray(image.crop((left, top, left + crop_w, top + crop_h)))
    # The crop in resized coordinates, mapped back to the decoded image's.
    sy, sx = height / rows, width / cols
    top_f, left_f = (rows - crop_h) / 2 * sy, (cols - crop_w) / 2 * sx
    box = (left_f, top_f, left_f + crop_w * sx, top_f + crop_h * sy)
    return np.asarray(image.resize((crop_w, crop_h), Image.Resampling.BILINEAR, box=box))
