"""The image step on the CPU: decoding against the libraries called by hand, its settings, and
hostile images failing their own request only."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from tests.toolkit.images import CROP, RESIZE, jpeg_bomb, photos, png, png_bomb, reference_pixels

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.processing.image import ImageBackend
from dlscale.errors import ConfigError, DlscaleError, InvalidInput, PayloadTooLarge
from dlscale.models.zoo.images import IMAGENET_MEAN, IMAGENET_STD
from dlscale.models.zoo.jpegs import encode_jpeg
from dlscale.types import Datatype, TensorSpec

IMAGENET = {"mean": IMAGENET_MEAN.ravel().tolist(), "std": IMAGENET_STD.ravel().tolist()}


def image_step(tmp_path: Path, **options: Any) -> ImageBackend:
    backend = create_backend(
        "image", tmp_path / "model.image", BackendOptions(max_batch_size=8, extra=options)
    )
    assert isinstance(backend, ImageBackend)
    backend.load()
    return backend


def rows(*images: bytes) -> dict[str, np.ndarray]:
    return {"image": np.array([[i] for i in images], dtype=object)}


@pytest.fixture(scope="module")
def pictures() -> np.ndarray:
    return photos(3, seed=4)


def test_jpeg_pixels_follow_a_decode_by_hand(tmp_path: Path, pictures: np.ndarray) -> None:
    step = image_step(tmp_path, resize=RESIZE, crop=CROP, **IMAGENET)
    jpegs = [encode_jpeg(p) for p in pictures]
    out = step.infer(rows(*jpegs))["pixels"]
    assert out.shape == (3, 3, CROP, CROP) and out.dtype == np.float32
    want = np.stack([reference_pixels(j) for j in jpegs])
    # The step decodes at a quarter of the size in the DCT and resamples the crop's exact box;
    # the hand decode is full size, then a whole-pixel crop: close, not equal.
    assert np.abs(out - want).mean() < 0.1
    assert np.corrcoef(out.ravel(), want.ravel())[0, 1] > 0.98
    step.unload()


def test_png_is_lossless_through_a_crop_without_resize(tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    step = image_step(tmp_path, resize=0, crop=[30, 40], dtype="UINT8", layout="NHWC")
    out = step.infer(rows(png(pixels)))["pixels"]
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out[0], pixels[5:35, 5:45])


def test_layout_channel_order_and_dtype(tmp_path: Path, pictures: np.ndarray) -> None:
    data = png(pictures[0])
    nhwc = image_step(tmp_path, resize=64, crop=48, dtype="UINT8", layout="NHWC")
    base = nhwc.infer(rows(data))["pixels"][0]
    bgr = image_step(tmp_path, resize=64, crop=48, dtype="UINT8", channel_order="BGR")
    np.testing.assert_array_equal(
        bgr.infer(rows(data))["pixels"][0], base[..., ::-1].transpose(2, 0, 1)
    )
    half = image_step(tmp_path, resize=64, crop=48, dtype="FP16", **IMAGENET)
    out = half.infer(rows(data))["pixels"][0]
    assert out.dtype == np.float16 and half.outputs[0].shape == (-1, 3, 48, 48)
    want = (base.transpose(2, 0, 1) / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    np.testing.assert_allclose(out.astype(np.float32), want, atol=1e-2)


@pytest.mark.parametrize(
    ("image", "error", "words"),
    [
        (b"", InvalidInput, "empty"),
        (b"hello, not an image", InvalidInput, "not an image in a known format"),
        (b"\xff\xd8\xff\xe0 then nothing", InvalidInput, "JPEG"),
        (png_bomb(8000), PayloadTooLarge, "refused before decoding"),
        (jpeg_bomb(60000), PayloadTooLarge, "refused before decoding"),
    ],
)
def test_hostile_images_fail_their_own_request(
    tmp_path: Path, pictures: np.ndarray, image: bytes, error: type[DlscaleError], words: str
) -> None:
    step = image_step(tmp_path, resize=RESIZE, crop=CROP)
    good = encode_jpeg(pictures[0])
    results = step.infer_requests([rows(good), rows(good, image), rows(good)])
    alone = step.infer(rows(good))["pixels"]
    assert isinstance(results[1], error), results[1]
    assert "row 1" in str(results[1]) and words in str(results[1])
    for result in (results[0], results[2]):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["pixels"], alone)
    with pytest.raises(error, match=words):
        step.infer(rows(image))


def test_truncated_jpeg_and_too_many_bytes(tmp_path: Path, pictures: np.ndarray) -> None:
    data = encode_jpeg(pictures[0])
    step = image_step(tmp_path, resize=RESIZE, crop=CROP, max_bytes=len(data) - 1)
    with pytest.raises(PayloadTooLarge, match="above the step's max_bytes"):
        step.infer(rows(data))
    with pytest.raises(InvalidInput, match="not a decodable JPEG"):
        step.infer(rows(data[: len(data) // 2]))


def test_an_image_smaller_than_the_crop_is_refused(tmp_path: Path) -> None:
    step = image_step(tmp_path, resize=0, crop=32)
    tiny = simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8), colorspace="RGB")
    with pytest.raises(InvalidInput, match="smaller than the 32x32 crop"):
        step.infer(rows(tiny))


def test_a_large_batch_decodes_in_threads_as_it_does_alone(
    tmp_path: Path, pictures: np.ndarray
) -> None:
    step = image_step(tmp_path, resize=RESIZE, crop=CROP, threads=2)
    jpegs = [encode_jpeg(p) for p in pictures] * 3
    together = step.infer(rows(*jpegs))["pixels"]
    for i, data in enumerate(jpegs):
        np.testing.assert_array_equal(together[i], step.infer(rows(data))["pixels"][0])


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"resise": 256}, "resise"),
        ({"resize": 100, "crop": 224}, "larger than the resized shorter side"),
        ({"dtype": "UINT8", "mean": [0.5, 0.5, 0.5]}, "not UINT8"),
        ({"std": [1.0, 0.0, 1.0]}, "std must be positive"),
        ({"layout": "CHWN"}, "layout"),
        ({"mean": [0.5, 0.5]}, "mean"),
        ({"crop": [1, 2, 3]}, "crop"),
        ({"device_output": True}, "needs a CUDA device"),
    ],
)
def test_settings_that_cannot_work_are_refused(
    tmp_path: Path, options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        image_step(tmp_path, **options)


def test_declared_tensors_rename_and_must_match(tmp_path: Path) -> None:
    declared = BackendOptions(
        max_batch_size=4,
        extra={"crop": 224},
        inputs=(TensorSpec("jpeg", Datatype.BYTES, (-1, 1)),),
        outputs=(TensorSpec("x", Datatype.FP32, (-1, 3, 224, 224)),),
    )
    step = ImageBackend(tmp_path / "model.image", declared)
    assert [s.name for s in step.inputs + step.outputs] == ["jpeg", "x"]
    wrong = BackendOptions(
        max_batch_size=4, outputs=(TensorSpec("x", Datatype.FP16, (-1, 3, 224, 224)),)
    )
    with pytest.raises(ConfigError, match="declared FP16"):
        ImageBackend(tmp_path / "model.image", wrong)
    with pytest.raises(ConfigError, match="max_batch_size"):
        ImageBackend(tmp_path / "model.image", BackendOptions(max_batch_size=0))


def test_pillow_formats_other_than_png(tmp_path: Path, pictures: np.ndarray) -> None:
    step = image_step(tmp_path, resize=0, crop=64, dtype="UINT8", layout="NHWC")
    buffer = io.BytesIO()
    Image.fromarray(pictures[0]).save(buffer, "BMP")
    out = step.infer(rows(buffer.getvalue()))["pixels"][0]
    np.testing.assert_array_equal(out, pictures[0][155:219, 218:282])


def test_a_request_of_the_wrong_shape_fails_alone(tmp_path: Path, pictures: np.ndarray) -> None:
    step = image_step(tmp_path, resize=RESIZE, crop=CROP)
    good = encode_jpeg(pictures[0])
    two_per_row = {"image": np.array([[good, good]], dtype=object)}
    results = step.infer_requests([two_per_row, rows(good)])
    assert isinstance(results[0], InvalidInput) and "one element per row" in str(results[0])
    assert isinstance(results[1], dict) and results[1]["pixels"].shape == (1, 3, CROP, CROP)


def test_the_device_paths_completeness_check_refuses_what_the_cpu_decoder_refuses(
    pictures: np.ndarray,
) -> None:
    """nvJPEG decodes a truncated file without a word, so the device path checks each JPEG for
    an end-of-image marker after its last scan first: a cut file is refused there as it is by
    the strict CPU decoder, and complete ones (progressive, with bytes after the end) pass."""
    from dlscale.backends.processing.decode import check_complete

    baseline = encode_jpeg(pictures[0])
    buffer = io.BytesIO()
    Image.fromarray(pictures[1]).save(buffer, "JPEG", progressive=True)
    progressive = buffer.getvalue()
    for data in (baseline, progressive, baseline + b"\x00" * 16 + b"trailer"):
        check_complete(data)
        simplejpeg.decode_jpeg(data, strict=True)
    for data in (baseline, progressive):
        for cut in (len(data) // 2, len(data) - 2):
            with pytest.raises(InvalidInput, match="Premature end of JPEG file"):
                check_complete(data[:cut])
            with pytest.raises(ValueError, match="Premature end of JPEG file"):
                simplejpeg.decode_jpeg(data[:cut], strict=True)
