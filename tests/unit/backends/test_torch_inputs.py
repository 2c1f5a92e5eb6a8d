"""Declared input datatypes and inductor freezing on the CPU, against the ONNX reference.

UINT8 pixels (normalized inside the model) and FP16 inputs must give what the FP32 ONNX model
gives on the FP32 inputs they stand for; freezing (weights as constants, conv/BN folding) must
not change the answers. Eager for resnet50 (a few seconds), compiled for digits only.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch import TorchBackend
from dlscale.models.zoo import ZOO, build_zoo
from dlscale.models.zoo.inputs import PIXELS, as_input_type, torch_entry

Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def resnet_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resnet")
    build_zoo(root, ["resnet50"])
    return root


def _onnx(model_file: Path, inputs: Arrays) -> Arrays:
    ort = create_backend("onnxruntime", model_file, BackendOptions())
    ort.load()
    try:
        return ort.infer(inputs)
    finally:
        ort.unload()


def _torch(path: Path, inputs: Arrays, **extra: Any) -> tuple[Arrays, TorchBackend]:
    """The outputs, and the backend as it was loaded (its settings resolved, its signature)."""
    backend = create_backend("torch", path, BackendOptions(max_batch_size=8, extra=extra))
    assert isinstance(backend, TorchBackend)
    backend.load()
    try:
        return backend.infer(inputs), copy.copy(backend)
    finally:
        backend.unload()


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-6)


def test_pixels_round_trip_to_the_images_they_came_from() -> None:
    images = ZOO["resnet50"].sample(2, np.random.default_rng(0))["input"]
    pixels = PIXELS["resnet50"].to_pixels(images)
    assert pixels.dtype == np.uint8 and pixels.shape == images.shape
    # One level of 255 is at most 1/255/0.224 apart after normalization; rounding halves it.
    back = PIXELS["resnet50"].to_images(pixels)
    assert float(np.abs(back - images).max()) <= 0.5 / 255 / 0.224 + 1e-6


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resnet50_on_uint8_pixels_computes_what_onnx_does_on_their_images(
    resnet_repo: Path, tmp_path: Path, precision: str
) -> None:
    # BF16 too: the normalization must follow the model's dtype after BatchNorm folding
    # traced the module (a dtype read while tracing would stay FP32 and break the convs).
    model = ZOO["resnet50"]
    pixels = as_input_type(model, model.sample(3, np.random.default_rng(5)), "uint8")
    entry = torch_entry(model, "uint8")
    assert entry.inputs[0].datatype.value == "UINT8"
    got, backend = _torch(entry.write(tmp_path / "model.zoo"), pixels, precision=precision)
    assert backend.inputs[0].datatype.value == "UINT8"
    expected = _onnx(
        resnet_repo / "resnet50" / "1" / "model.onnx",
        {"input": PIXELS["resnet50"].to_images(pixels["input"])},
    )
    out, ref = got["output"], expected["output"]
    if precision == "fp32":
        assert _relative_error(out, ref) <= 5e-4
        assert (out.argmax(1) == ref.argmax(1)).all()
    else:
        cosine = float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref)))
        assert _relative_error(out, ref) <= 0.25 and cosine >= 0.99


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fp16_inputs_give_what_fp32_ones_give(
    small_repo: Path, tmp_path: Path, precision: str
) -> None:
    model = ZOO["mlp"]
    half = as_input_type(model, model.sample(5, np.random.default_rng(2)), "fp16")
    assert half["input"].dtype == np.float16
    path = torch_entry(model, "fp16").write(tmp_path / "model.zoo")
    got, _ = _torch(path, half, precision=precision)
    expected = _onnx(
        small_repo / "mlp" / "1" / "model.onnx", {"input": half["input"].astype(np.float32)}
    )
    bound = 5e-4 if precision == "fp32" else 0.05
    assert _relative_error(got["output"], expected["output"]) <= bound


def test_uint8_inputs_are_for_image_models_only() -> None:
    with pytest.raises(ValueError, match="takes no images"):
        torch_entry(ZOO["bert-base"], "uint8")


def test_freezing_keeps_a_compiled_model_s_answers(small_repo: Path, tmp_path: Path) -> None:
    model = ZOO["digits"]
    inputs = model.sample(4, np.random.default_rng(4))
    path = torch_entry(model).write(tmp_path / "model.zoo")
    got, backend = _torch(path, inputs, compile=True, freezing=True)
    assert backend.settings.freezing is True
    expected = _onnx(small_repo / "digits" / "1" / "model.onnx", inputs)
    assert _relative_error(got["output"], expected["output"]) <= 5e-4
