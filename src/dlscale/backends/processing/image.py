"""The image step: encoded images (BYTES, one per row) in, one batched pixel tensor out.

Each row is decoded, its shorter side resized and its centre cropped (decode.py on the CPU,
cuda_image.py with nvJPEG on a GPU), then laid out (NCHW or NHWC), put in channel order (RGB or
BGR) and, for floating-point outputs, normalized per channel: `(pixels / 255 - mean) / std`.
A row that cannot be decoded fails its own request (400, or 413 for an image above the bounds),
never the other requests of the batch: the step takes its batch request by request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dlscale.backends.base import BackendOptions, RequestResult
from dlscale.backends.processing.decode import decode_rgb
from dlscale.backends.processing.image_options import ImageOptions, normalization
from dlscale.backends.processing.options import as_bytes, bind, read_options
from dlscale.backends.processing.step import RowsStep
from dlscale.errors import ConfigError, DlscaleError
from dlscale.types import Datatype, TensorSpec

#: Decode threads when `threads` is 0: libjpeg-turbo decodes one image per thread, and more
#: threads than this rarely help a batch (they contend with the model's own threads).
DEFAULT_THREADS = 4
#: Rows of a batch below which decoding stays in the calling thread (a hand-over costs more).
PARALLEL_FROM = 2


class ImageBackend(RowsStep):
    """Decode, resize, crop and normalize a batch of encoded images (docs/processing.md)."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        super().__init__(path, options)
        self.settings = read_options(ImageOptions, options.extra, "image")
        self.geometry = self.settings.geometry()
        self._check_settings()
        self.inputs = bind(options.inputs, [TensorSpec("image", Datatype.BYTES, (-1, 1))], "input")
        self.outputs = bind(options.outputs, [self._pixel_spec()], "output")
        self._gain, self._offset = normalization(self.settings)
        self._pool: ThreadPoolExecutor | None = None
        self._threads = 1
        self._device: object | None = None

    def _check_settings(self) -> None:
        s = self.settings
        if s.dtype == "UINT8" and (s.mean != [0.0, 0.0, 0.0] or s.std != [1.0, 1.0, 1.0]):
            raise ConfigError("image step: mean and std apply to FP32 and FP16 outputs, not UINT8")
        if any(v <= 0 for v in s.std):
            raise ConfigError(f"image step: std must be positive, got {s.std}")
        self._needs_rows("image", "images")
        if s.device_output and not self.options.device.startswith("cuda"):
            raise ConfigError(
                f"image step: device_output needs a CUDA device, not {self.options.device!r}"
            )

    def _pixel_spec(self) -> TensorSpec:
        h, w = self.geometry.crop
        shape = (-1, 3, h, w) if self.settings.layout == "NCHW" else (-1, h, w, 3)
        return TensorSpec("pixels", Datatype(self.settings.dtype), shape)

    # -- the Backend protocol ------------------------------------------------------------------

    def load(self) -> None:
        _first_decode()  # imports the decoders and touches their code now, not on a request
        self._threads = self.settings.threads or min(DEFAULT_THREADS, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="image-decode")
        if self.options.device.startswith("cuda"):
            from dlscale.backends.processing.cuda_image import CudaImages

            self._device = CudaImages(self.options.device, self.settings, self.geometry)

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """Every row of every request decoded at once; a request with a bad row fails alone."""
        name = self.inputs[0].name
        rows, spans = self._rows(requests, lambda element, _: element)
        pixels, errors = self._decode(rows)
        results: list[RequestResult] = []
        for span in spans:
            if isinstance(span, DlscaleError):
                results.append(span)
                continue
            failed = next(((i - span.start, e) for i in span if (e := errors[i])), None)
            if failed is None:
                results.append({self.outputs[0].name: pixels[span.start : span.stop]})
            else:
                row, error = failed
                results.append(type(error)(f"input {name!r}, row {row}: the image {error}"))
        return results

    def unload(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._device = None

    # -- decoding ------------------------------------------------------------------------------

    def _decode(self, rows: list[object]) -> tuple[np.ndarray, list[DlscaleError | None]]:
        if self._device is not None:
            from dlscale.backends.processing.cuda_image import CudaImages

            assert isinstance(self._device, CudaImages)
            return self._device.decode(rows, self._pool, self.settings.device_output)
        spec = self.outputs[0]
        out = np.empty((len(rows), *spec.shape[1:]), spec.datatype.numpy)
        errors: list[DlscaleError | None] = [None] * len(rows)

        def chunk(part: range) -> None:
            for i in part:
                try:
                    self._place(decode_rgb(as_bytes(rows[i]), self.geometry), out[i])
                except DlscaleError as exc:
                    errors[i] = exc

        if len(rows) < PARALLEL_FROM or self._pool is None:
            chunk(range(len(rows)))
            return out, errors
        # One share of the rows per thread, the calling thread's included: a
        # hand-over per share, not per row, and no thread idles waiting for the others.
        shares = min(self._threads, len(rows))
        parts = [range(k, len(rows), shares) for k in range(shares)]
        pending = [self._pool.submit(chunk, part) for part in parts[1:]]
        chunk(parts[0])
        for future in pending:
            future.result()
        return out, errors

    def _place(self, rgb: np.ndarray, out: np.ndarray) -> None:
        """Write one UINT8 [h, w, 3] RGB crop into its row of the batch, in the output's
        channel order, layout and dtype (normalized in place: a temporary array per image
        would cost ten times the arithmetic)."""
        s = self.settings
        pixels = rgb[..., ::-1] if s.channel_order == "BGR" else rgb
        if s.layout == "NCHW":
            pixels = pixels.transpose(2, 0, 1)
        if s.dtype == "UINT8":
            out[...] = pixels
            return
        np.multiply(pixels, self._gain, out=out)
        out += self._offset


def _first_decode() -> None:
    """Encode and decode one small image with each library (a config's default warm-up, a row
    of zeros, is no image: image steps are warmed here instead)."""
    import io

    import simplejpeg
    from PIL import Image

    pixels = np.zeros((16, 16, 3), np.uint8)
    simplejpeg.decode_jpeg(simplejpeg.encode_jpeg(pixels), colorspace="RGB")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    Image.open(buffer).convert("RGB").resize((8, 8), Image.Resampling.BILINEAR)
