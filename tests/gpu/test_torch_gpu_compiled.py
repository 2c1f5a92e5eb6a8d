"""Compiled torch paths on a CUDA GPU: AOTInductor packages, freezing, 8-bit convolutions.

Run on a GPU machine with `make test-gpu` (docs/testing.md; this file several minutes:
resnet50 is compiled into a package once, about a minute on an H100 host). References are the
ONNX Runtime backend on the CPU, with the tolerances of test_torch_gpu.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.toolkit.gpu import torch_cuda_missing

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch.aoti import PACKAGE_NAME
from dlscale.backends.torch.packaging import Packaged, package_model
from dlscale.backends.torch.precision import fp8_supported, lowp_layers
from dlscale.models.zoo import ZOO, build_zoo
from dlscale.models.zoo.inputs import PIXELS, as_input_type, torch_entry

NO_CUDA = torch_cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA is not None, reason=str(NO_CUDA))]
Arrays = dict[str, np.ndarray]
TOLERANCE = {"fp16": (0.05, 0.999), "fp8": (0.5, 0.98), "int8": (0.5, 0.98)}
MAX_BATCH = 16


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    build_zoo(root, ["mlp", "resnet50"])
    return root


@pytest.fixture(scope="module")
def resnet_package(tmp_path_factory: pytest.TempPathFactory) -> Packaged:
    folder = tmp_path_factory.mktemp("resnet-package")
    source = torch_entry(ZOO["resnet50"], "uint8").write(folder / "model.zoo")
    options = BackendOptions("cuda:0", max_batch_size=MAX_BATCH, extra={"precision": "fp16"})
    return package_model(source, options, folder / PACKAGE_NAME)


def reference(zoo: Path, name: str, inputs: Arrays) -> Arrays:
    fp32 = {
        k: PIXELS[name].to_images(v) if v.dtype == np.uint8 else v.astype(np.float32)
        for k, v in inputs.items()
    }
    ort = create_backend("onnxruntime", zoo / name / "1" / "model.onnx", BackendOptions())
    ort.load()
    return ort.infer(fp32)


def served(path: Path, inputs: Arrays, **extra: Any) -> tuple[Arrays, Any]:
    backend = create_backend(
        "torch", path, BackendOptions("cuda:0", max_batch_size=MAX_BATCH, extra=extra)
    )
    start = time.perf_counter()
    backend.load()
    load_s = time.perf_counter() - start
    try:
        return backend.infer(inputs), (backend.settings, load_s, backend._module)
    finally:
        backend.unload()


def assert_close(got: Arrays, expected: Arrays, precision: str) -> None:
    bound, floor = TOLERANCE[precision]
    for name, ref in expected.items():
        out = got[name]
        assert out.shape == ref.shape and out.dtype == ref.dtype
        error = float(np.abs(out - ref).max()) / max(float(np.abs(ref).max()), 1e-6)
        cosine = float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref)))
        assert error <= bound and cosine >= floor, f"{name}: error {error:.3g}, cos {cosine:.5f}"


def test_a_resnet50_package_serves_uint8_pixels_with_cuda_graphs(
    zoo: Path, resnet_package: Packaged
) -> None:
    info = resnet_package.info
    assert (info.device, info.precision, info.channels_last, info.freezing) == (
        "cuda",
        "fp16",
        True,
        True,
    )
    model = ZOO["resnet50"]
    inputs = as_input_type(model, model.sample(5, np.random.default_rng(3)), "uint8")
    got, (settings, _, _) = served(resnet_package.path, inputs)
    assert settings.cuda_graphs
    assert_close(got, reference(zoo, "resnet50", inputs), "fp16")


def test_the_fp16_batchnorm_package_records_this_torch_and_this_gpu(
    resnet_package: Packaged,
) -> None:
    # resnet50's BatchNorm folded and cast to FP16 on the GPU: every such build once failed
    # (inference tensors refused by torch.export, tests/unit/backends/test_torch_aoti.py).
    major, minor = torch.cuda.get_device_capability(0)
    info = resnet_package.info
    assert (info.precision, info.device) == ("fp16", "cuda")
    assert info.torch_version == torch.__version__ and info.capability == f"{major}.{minor}"


def test_the_package_runs_every_bucket_with_exactly_the_rows_asked_for(
    resnet_package: Packaged,
) -> None:
    model = ZOO["resnet50"]
    batch = as_input_type(model, model.sample(MAX_BATCH, np.random.default_rng(4)), "uint8")
    backend = create_backend(
        "torch", resnet_package.path, BackendOptions("cuda:0", max_batch_size=MAX_BATCH)
    )
    backend.load()
    try:
        full = backend.infer(batch)["output"]
        for rows in (1, 3, 9, MAX_BATCH):
            got = backend.infer({"input": batch["input"][:rows]})["output"]
            np.testing.assert_allclose(got, full[:rows], rtol=2e-2, atol=2e-2)
    finally:
        backend.unload()


def test_compiled_with_freezing_and_graphs_matches(zoo: Path) -> None:
    model = ZOO["mlp"]
    inputs = model.sample(5, np.random.default_rng(6))
    path = torch_entry(model).write(zoo / "mlp" / "1" / "model.zoo")
    got, (settings, _, _) = served(path, inputs, precision="fp16", compile=True)
    assert settings.freezing and settings.cuda_graphs
    assert_close(got, reference(zoo, "mlp", inputs), "fp16")


@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("convs", ["pointwise", "all"])
def test_8_bit_convolutions_stay_close_to_fp32(zoo: Path, precision: str, convs: str) -> None:
    if precision == "fp8" and not fp8_supported(torch.cuda.get_device_capability(0)):
        pytest.skip("FP8 needs compute capability 8.9")
    model = ZOO["resnet50"]
    inputs = as_input_type(model, model.sample(8, np.random.default_rng(8)), "uint8")
    path = torch_entry(model, "uint8").write(zoo / "resnet50" / "1" / "model.zoo")
    got, (_, _, module) = served(path, inputs, precision=precision, lowp_convs=convs)
    # 1x1: 36 convolutions and the head; all: the 3x3 ones too (the 7x7 stem stays).
    assert lowp_layers(module) == (37 if convs == "pointwise" else 53)
    expected = reference(zoo, "resnet50", inputs)
    assert_close(got, expected, precision)
    agreement = np.mean(got["output"].argmax(1) == expected["output"].argmax(1))
    assert agreement >= 0.75, f"top-1 agreement {agreement:.2%} on 8 images"
