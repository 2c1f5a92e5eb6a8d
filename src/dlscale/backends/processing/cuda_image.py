"""The image step on a CUDA device: JPEGs decoded by nvJPEG (`torchvision.io.decode_jpeg` with
`device="cuda"`), resized, cropped and normalized by torch on the device.

Headers are read and bounded on the CPU first (decode.py's checks: bytes, pixels, crop), so a
bomb never reaches the decoder; the JPEGs that pass are decoded as one batch. Should the batch
decode fail, each is decoded alone, so that a bad file fails only its own row. Other formats
(PNG) are decoded on the CPU and uploaded. Needs the `[torch]` extra and torchvision.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from dlscale.backends.processing.decode import (
    JPEG_MAGIC,
    Geometry,
    check_complete,
    check_pixels,
    check_size,
    decode_rgb,
    jpeg_size,
)
from dlscale.backends.processing.image_options import ImageOptions, normalization
from dlscale.backends.processing.options import as_bytes
from dlscale.errors import ConfigError, DlscaleError

if TYPE_CHECKING:
    import torch


class CudaImages:
    """Decode and arrange a batch of images on one CUDA device."""

    def __init__(self, device: str, settings: ImageOptions, geometry: Geometry) -> None:
        try:
            import torch
            from torchvision.io import ImageReadMode, decode_jpeg  # nvJPEG lives there
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"the image step on {device} needs {exc.name}: pip install 'dlscale[torch]' "
                "torchvision"
            ) from None
        self.device = torch.device(device)
        self._decode_jpeg, self._rgb = decode_jpeg, ImageReadMode.RGB
        self.settings = settings
        self.geometry = geometry
        gain, offset = normalization(settings)
        self.gain = torch.from_numpy(gain).to(self.device)
        self.offset = torch.from_numpy(offset).to(self.device)
        self.dtype = {"FP32": torch.float32, "FP16": torch.float16, "UINT8": torch.uint8}[
            settings.dtype
        ]

    def decode(
        self, rows: list[object], pool: ThreadPoolExecutor | None, on_device: bool
    ) -> tuple[Any, list[DlscaleError | None]]:
        """The batch's pixels on the host, or (`on_device`) as a CuPy array over the device tensor
        that the next step of a pipeline reads in place; and each row's error (None: it decoded)."""
        import torch

        h, w = self.geometry.crop
        shape = (len(rows), 3, h, w) if self.settings.layout == "NCHW" else (len(rows), h, w, 3)
        pixels = torch.empty(shape, dtype=self.dtype, device=self.device)
        errors: list[DlscaleError | None] = [None] * len(rows)
        for i, image in self._decode_all(rows, errors, pool).items():
            pixels[i] = self._arrange(image)
        if not on_device:
            return pixels.cpu().numpy(), errors
        # The next step computes on streams of its own: the pixels must be complete first.
        torch.cuda.current_stream(self.device).synchronize()
        try:
            import cupy
        except ModuleNotFoundError:
            raise ConfigError(
                "image step: device_output needs cupy: pip install 'dlscale[gpu]'"
            ) from None
        return cupy.asarray(pixels), errors

    def _decode_all(
        self, rows: list[object], errors: list[DlscaleError | None], pool: ThreadPoolExecutor | None
    ) -> dict[int, torch.Tensor]:
        """Row -> UINT8 [3, H, W] RGB on the device, for each row that decodes."""
        import torch

        jpegs: dict[int, bytes] = {}
        images: dict[int, torch.Tensor] = {}

        def on_host(i: int) -> None:
            try:
                data = as_bytes(rows[i])
                check_size(data, self.geometry)
                if data.startswith(JPEG_MAGIC):
                    check_pixels(*jpeg_size(data), self.geometry)
                    check_complete(data)
                    jpegs[i] = data
                else:  # cropped on the CPU already; only arranged on the device
                    rgb = decode_rgb(data, self.geometry)
                    images[i] = torch.from_numpy(rgb).permute(2, 0, 1).to(self.device)
            except DlscaleError as exc:
                errors[i] = exc

        _each(on_host, len(rows), pool)
        images.update(self._nvjpeg(jpegs, errors))
        return images

    def _nvjpeg(
        self, jpegs: dict[int, bytes], errors: list[DlscaleError | None]
    ) -> dict[int, torch.Tensor]:
        import torch

        decode_jpeg, mode = self._decode_jpeg, self._rgb
        if not jpegs:
            return {}
        order = list(jpegs)
        data = [torch.frombuffer(bytearray(jpegs[i]), dtype=torch.uint8) for i in order]
        try:
            decoded = decode_jpeg(data, mode=mode, device=self.device)
            return {i: self._resize_and_crop(t) for i, t in zip(order, decoded, strict=True)}
        except RuntimeError:
            pass  # one bad file fails nvJPEG's whole batch: find it, one file at a time
        out = {}
        for i, tensor in zip(order, data, strict=True):
            try:
                image = decode_jpeg(tensor, mode=mode, device=self.device)
                out[i] = self._resize_and_crop(image)
            except RuntimeError:
                # What nvJPEG does not take (CMYK, some progressive files) libjpeg-turbo may:
                # the CPU path decodes it, or says what is wrong with it.
                try:
                    rgb = decode_rgb(jpegs[i], self.geometry)
                    out[i] = torch.from_numpy(rgb).permute(2, 0, 1).to(self.device)
                except DlscaleError as exc:
                    errors[i] = exc
        return out

    def _resize_and_crop(self, image: torch.Tensor) -> torch.Tensor:
        """UINT8 [3, H, W] -> UINT8 [3, crop h, crop w]: the crop's source box, resampled
        bilinearly with antialiasing (as Pillow does on the CPU)."""
        import torch

        _, height, width = image.shape
        rows, cols = self.geometry.resized(height, width)
        crop_h, crop_w = self.geometry.crop
        if (rows, cols) == (height, width):
            top, left = (height - crop_h) // 2, (width - crop_w) // 2
            return image[:, top : top + crop_h, left : left + crop_w]
        resized = torch.nn.functional.interpolate(
            image[None].float(), size=(rows, cols), mode="bilinear", antialias=True
        )[0]
        top, left = (rows - crop_h) // 2, (cols - crop_w) // 2
        crop = resized[:, top : top + crop_h, left : left + crop_w]
        return crop.round_().clamp_(0, 255).to(torch.uint8)

    def _arrange(self, chw: torch.Tensor) -> torch.Tensor:
        """UINT8 [3, h, w] RGB -> the output's channel order, layout and dtype."""
        if self.settings.channel_order == "BGR":
            chw = chw.flip(0)
        pixels = chw if self.settings.layout == "NCHW" else chw.permute(1, 2, 0)
        if self.settings.dtype == "UINT8":
            return pixels
        return (pixels.float() * self.gain + self.offset).to(self.dtype)


def _each(work: Callable[[int], None], count: int, pool: ThreadPoolExecutor | None) -> None:
    if pool is None or count < 2:
        for i in range(count):
            work(i)
    else:
        list(pool.map(work, range(count)))
