"""Two tenants on one GPU, and each on its own MIG instance: `dlscale bench interference`.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_qos_gpu.py`. The shared-GPU test needs
onnxruntime's CUDA provider; the MIG test needs a GPU in MIG mode with two instances (MIG mode
cannot be changed on lent machines, so it skips there). Figures go to BENCHMARKS.md through
`python -m benchmarks.interference --device cuda`; these tests check the verb runs end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
from tests.toolkit.benchmarks import run_benchmark

from dlscale.bench.tenants import mig_pair

try:
    from dlscale.cli import main
except RuntimeError as exc:  # the committed gRPC stubs refuse a grpcio older than theirs
    pytest.skip(
        f"dlscale's gRPC stubs cannot load here ({exc}): carry the wheels of scripts/gpu-wheels",
        allow_module_level=True,
    )
from dlscale.hardware.detect import detect

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(),
        reason="needs onnxruntime's CUDA provider",
    ),
]
SHORT = ["--rate", "50", "--duration", "3s", "--repeats", "1", "--objective", "20ms"]


def tenants(root: Path, device: str) -> Path:
    """benchmarks/interference.py's two tenants on `device`, written by the script itself."""
    argv = ["--device", device, "--repo-only", str(root)]
    done = run_benchmark("interference", *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def _run(repo: Path, out: Path, *extra: str) -> dict[str, object]:
    args = ["bench", "interference", "--repo", str(repo), "--protected", "protected"]
    assert main([*args, "--neighbor", "resnet50", *SHORT, *extra, "--out", str(out)]) == 0
    report: dict[str, object] = json.loads((out / "report.json").read_text())
    return report


def test_resnet50_floods_the_gpu_beside_a_small_model(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="resnet50 is built by the zoo ([torch] extra)")
    report = _run(tenants(tmp_path / "repo", "cuda:0"), tmp_path / "out")
    assert report["conditions"] == ["off", "on"]
    assert report["device"] not in (None, "CPU")


def test_each_tenant_on_its_own_mig_instance(tmp_path: Path) -> None:
    if mig_pair(detect()) is None:
        pytest.skip("needs a GPU in MIG mode with two MIG instances")
    pytest.importorskip("torch", reason="resnet50 is built by the zoo ([torch] extra)")
    report = _run(tenants(tmp_path / "repo", "cuda:0"), tmp_path / "out", "--mig")
    phases = [p["condition"] for p in report["phases"]]  # type: ignore[attr-defined]
    assert "mig" in phases and "mig alone" in phases
