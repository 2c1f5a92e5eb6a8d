"""`dlscale optimize` with the PyTorch variants on the zoo's MLP: built from its module, guarded
against the ONNX FP32 reference, measured with LoadGen; a variant the CPU cannot run fails with
its reason, and a torch winner is written as a version that loads and serves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlscale.models.config import load_config
from dlscale.models.repository import ModelRepository
from dlscale.optimize import OptimizeResult, OptimizeSettings, optimize
from dlscale.optimize.measure import MeterSettings
from dlscale.optimize.torch_variants import torch_precision_variants
from dlscale.optimize.variants import DeviceCaps, ModelFacts, Variant, detect_caps, model_facts
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

pytest.importorskip("torch")

SHORT_METER = MeterSettings(seconds=0.5, min_queries=16, warmup_s=0.2, singlestream=False)
#: TF32 is refused on a CPU by the torch backend; forced in, it must fail and say why.
FORCED_TF32 = Variant(
    "torch-tf32-forced", "tf32", "torch-export", {}, {"precision": "tf32"}, runtime="torch"
)
ONLY = ("torch-fp32", "torch-bf16", "torch-tf32")


def expected_trials(facts: ModelFacts, caps: DeviceCaps) -> set[str]:
    """The trials the search makes here: the ONNX FP32 baseline, the forced variant, and the
    torch variants of ONLY that the planner offers this CPU (BF16 only with BF16 dot products)."""
    tried, _ = torch_precision_variants(facts, caps, has_calibration=True)
    offered = {v.name for v in tried} & set(ONLY)
    return {"fp32", FORCED_TF32.name, *offered}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dlscale.models.zoo import build_zoo

    root = tmp_path_factory.mktemp("zoo")
    build_zoo(root, ["mlp"])
    return root


@pytest.fixture(scope="module")
def result(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> OptimizeResult:
    repo = tmp_path_factory.mktemp("torch-opt")
    shutil.copytree(zoo / "mlp", repo / "mlp")
    settings = OptimizeSettings(
        device="cpu",
        tolerance=0.02,
        only=ONLY,
        extra_variants=(FORCED_TF32,),
        # Stage two would compile (inductor, tens of seconds); the unit tests cover its list.
        runtime_stage=False,
        meter=SHORT_METER,
        time_budget_s=300,
    )
    return optimize(repo, "mlp", settings)


def _trial(result: OptimizeResult, name: str):  # type: ignore[no-untyped-def]
    return next(t for t in result.trials if t.variant.name == name)


def test_the_torch_fp32_variant_is_built_guarded_and_measured(result: OptimizeResult) -> None:
    assert result.metric.value == "agreement"
    fp32 = _trial(result, "torch-fp32")
    assert fp32.status == "accepted", fp32.reason
    assert fp32.accuracy is not None and fp32.accuracy.value == 1.0
    assert fp32.accuracy.samples == result.data["validation_rows"] == 256
    assert fp32.speed is not None and fp32.speed.offline_sps > 0
    assert fp32.build_s > 0


def _expected_here(result: OptimizeResult) -> set[str]:
    source = result.version_dir.parent / str(result.source_version) / "model.onnx"
    return expected_trials(model_facts(source), detect_caps("cpu"))


def test_bf16_is_judged_by_the_guard_and_measured(result: OptimizeResult) -> None:
    if "torch-bf16" not in _expected_here(result):
        # An AVX2-only CPU: no BF16 dot products, so BF16 is skipped and the report says why.
        skipped = {s.name: s.reason for s in result.skipped}
        assert "BF16" in skipped["torch-bf16"] and "emulated" in skipped["torch-bf16"]
        return
    bf16 = _trial(result, "torch-bf16")
    assert bf16.status in ("accepted", "rejected"), bf16.reason
    assert bf16.accuracy is not None and bf16.accuracy.value >= 0.9
    assert bf16.speed is not None and bf16.speed.offline_sps > 0


def test_a_variant_the_cpu_cannot_run_fails_with_its_reason(result: OptimizeResult) -> None:
    forced = _trial(result, "torch-tf32-forced")
    assert forced.status == "failed" and forced.speed is None
    assert "tf32" in forced.reason and "tensor cores" in forced.reason
    # The search went on: the winner is among the measured, accepted variants.
    assert result.winner.accepted and result.winner.speed is not None


def test_the_report_names_what_this_cpu_does_not_get(result: OptimizeResult) -> None:
    report = json.loads((result.version_dir / "optimize_report.json").read_text())
    skipped = {s["name"]: s["reason"] for s in report["skipped"]}
    assert "CUDA" in skipped["torch-tf32"] and "8.9" in skipped["torch-fp8"]
    trials = {t["name"]: t for t in report["trials"]}
    assert set(trials) == _expected_here(result)
    assert trials["torch-tf32-forced"]["status"] == "failed"
    assert "torch-tf32-forced" in (result.version_dir / "optimize_report.md").read_text()


def test_the_expected_trials_follow_the_cpu_flags() -> None:
    # CI runs on whatever machine the developer has: the expectation comes from the flags.
    mlp = ModelFacts({"Gemm": 3, "Relu": 2}, image_input=False, transformer=False)
    avx2 = DeviceCaps("cpu", 2, frozenset({"avx2", "fma"}), torch=True)
    avx512_bf16 = DeviceCaps("cpu", 2, frozenset({"avx2", "avx512f", "avx512_bf16"}), torch=True)
    assert expected_trials(mlp, avx2) == {"fp32", "torch-fp32", "torch-tf32-forced"}
    assert expected_trials(mlp, avx512_bf16) == {
        "fp32",
        "torch-fp32",
        "torch-bf16",
        "torch-tf32-forced",
    }


async def test_the_written_version_serves_what_the_onnx_version_computes(
    result: OptimizeResult, zoo: Path
) -> None:
    repo_root = result.version_dir.parent.parent
    config = load_config(repo_root / "mlp" / "config.toml", "mlp")
    winner = result.winner.variant
    assert config.backend == winner.runtime
    if result.written_version is None:  # FP32, the source, won: nothing was copied
        assert winner.name == "fp32" and "optimized_variant" not in config.metadata
    else:
        assert config.metadata["optimized_variant"] == winner.name
    if winner.runtime == "torch":
        assert (result.version_dir / "model.pt2").is_file()
        assert config.backend_options.model_extra == dict(winner.backend_options)
    data = np.load(zoo / "mlp" / "1" / "validation.npz")["input"][:32]
    reference = await _serve(ModelRepository(zoo), data)
    served = await _serve(ModelRepository(repo_root), data)
    assert np.mean(served.argmax(1) == reference.argmax(1)) >= 0.9


async def _serve(repo: ModelRepository, x: np.ndarray) -> np.ndarray:
    manager = ModelManager(repo)
    await manager.load("mlp")
    try:
        response = await DataPlane(manager).infer(InferenceRequest("mlp", {"input": x}))
        return np.asarray(response.outputs["output"])
    finally:
        await manager.close()


async def test_a_torch_winner_written_into_the_repository_loads_and_serves(
    zoo: Path, tmp_path: Path
) -> None:
    from dlscale.models.zoo import ZOO
    from dlscale.optimize.staging import backend_options_of, derived_config, stage
    from dlscale.optimize.torch_build import TorchBuilder, TorchSource
    from dlscale.optimize.writing import write_version

    shutil.copytree(zoo / "mlp", tmp_path / "repo" / "mlp")
    repo = ModelRepository(tmp_path / "repo")
    source = repo.version("mlp")
    data = dict(np.load(source.path / "validation.npz"))
    built = TorchBuilder(TorchSource(ZOO["mlp"], 128), tmp_path / "scratch", data).build(
        "torch-export", tmp_path / "build", None
    )
    variant = Variant("torch-fp32", "fp32", "torch-export", {}, {"precision": "fp32"}, "torch")
    config = derived_config(
        source.config,
        "torch-fp32",
        backend="torch",
        backend_options=backend_options_of(source.config, variant.backend_options, "torch"),
    )
    staged = stage(tmp_path / "staged", "torch-fp32", config, built, data)
    version, target, _ = write_version(repo, source, variant, staged)
    assert (target / "model.pt2").is_file() and repo.version("mlp").version == version
    x = data["input"][:32]
    served = await _serve(repo, x)
    reference = await _serve(ModelRepository(zoo), x)
    np.testing.assert_allclose(served, reference, rtol=1e-4, atol=1e-4)
