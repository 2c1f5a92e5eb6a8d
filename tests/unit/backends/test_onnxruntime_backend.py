"""The ONNX Runtime backend's device choice on a machine whose onnxruntime has no CUDA provider.

The GPU side (CUDA and TensorRT providers chosen) is tests/gpu/test_onnxruntime_gpu.py.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime
import pytest
from tests.toolkit.models import identity_graph, save_onnx

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.onnxruntime import providers_for
from dlscale.errors import ConfigError

CPU_ONLY = "CUDAExecutionProvider" not in onnxruntime.get_available_providers()


def test_cpu_takes_the_cpu_provider_alone(tmp_path: Path) -> None:
    assert providers_for("cpu", {"tensorrt": True}) == ["CPUExecutionProvider"]
    backend = create_backend("onnxruntime", save_onnx(identity_graph(), tmp_path / "m.onnx"),
                             BackendOptions())  # fmt: skip
    backend.load()
    assert backend.providers == ["CPUExecutionProvider"]
    backend.unload()


@pytest.mark.skipif(not CPU_ONLY, reason="checks the refusal where onnxruntime lacks CUDA")
@pytest.mark.parametrize("device", ["cuda:0", "cuda:1", "MIG-5f9b7c1e"])
def test_a_gpu_device_without_the_cuda_provider_is_a_clear_error(
    device: str, tmp_path: Path
) -> None:
    model = save_onnx(identity_graph(), tmp_path / "m.onnx")
    backend = create_backend("onnxruntime", model, BackendOptions(device=device))
    with pytest.raises(ConfigError, match="install onnxruntime-gpu or use device 'cpu'") as err:
        backend.load()
    assert f"device {device!r} needs onnxruntime's CUDA provider" in str(err.value)
