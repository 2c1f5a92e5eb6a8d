"""ONNX Runtime on a CUDA GPU: the CUDA provider chosen for cuda:N, TensorRT first when asked.

Run on a GPU machine with `make test-gpu` and onnxruntime-gpu installed (docs/testing.md);
skipped elsewhere, saying what is missing (a GPU, or onnxruntime's CUDA provider).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from tests.toolkit.gpu import onnxruntime_cuda_missing
from tests.toolkit.models import Mlp, save_onnx

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.onnxruntime import OnnxRuntimeBackend

NO_CUDA = onnxruntime_cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA is not None, reason=str(NO_CUDA))]
MLP = Mlp.seeded(3, (16, 32, 4))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_onnx(MLP.graph(), tmp_path_factory.mktemp("ort-gpu") / "model.onnx")


def loaded(model_file: Path, device: str, **extra: object) -> Iterator[OnnxRuntimeBackend]:
    backend = create_backend("onnxruntime", model_file, BackendOptions(device=device, extra=extra))
    assert isinstance(backend, OnnxRuntimeBackend)
    backend.load()
    try:
        yield backend
    finally:
        backend.unload()


def test_cuda_device_runs_on_the_cuda_provider(model_file: Path) -> None:
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    for backend in loaded(model_file, "cuda:0"):
        assert backend.providers[0] == "CUDAExecutionProvider"
        got = backend.infer({"x": x})["y"]
        np.testing.assert_allclose(got, MLP.reference(x), rtol=1e-3, atol=1e-3)


def test_tensorrt_comes_first_when_asked(model_file: Path) -> None:
    available = onnxruntime.get_available_providers()
    if "TensorrtExecutionProvider" not in available:
        pytest.skip(f"this onnxruntime has no TensorRT provider ({available})")
    x = np.ones((2, 16), np.float32)
    for backend in loaded(model_file, "cuda:0", tensorrt=True):
        assert backend.providers[:2] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        np.testing.assert_allclose(backend.infer({"x": x})["y"], MLP.reference(x), rtol=1e-2)
    for backend in loaded(model_file, "cuda:0"):  # not asked: CUDA alone
        assert "TensorrtExecutionProvider" not in backend.providers
