"""`dlscale optimize` on the zoo's digits CNN: real training, real quantization, real LoadGen."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlscale.cli import main
from dlscale.errors import OptimizeError
from dlscale.models.config import load_config
from dlscale.models.repository import ModelRepository
from dlscale.optimize import OptimizeResult, OptimizeSettings, optimize
from dlscale.optimize.commands import outcome_lines
from dlscale.optimize.measure import MeterSettings
from dlscale.optimize.slo import SloSettings
from dlscale.optimize.variants import ModelFacts, detect_caps, precision_variants
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

# What to expect comes from the detected CPU: these tests are about INT8, which a CPU without
# AVX2 is not offered.
_NO_INT8 = [
    s.reason
    for s in precision_variants(
        ModelFacts({"Conv": 1, "MatMul": 1}, image_input=True, transformer=False),
        detect_caps("cpu"),
        has_calibration=True,
    )[1]
    if s.name == "int8-*"
]
pytestmark = pytest.mark.skipif(bool(_NO_INT8), reason=f"no INT8 variants here: {_NO_INT8}")

SHORT_METER = MeterSettings(seconds=0.5, min_queries=16, warmup_s=0.2)
SHORT_SLO = SloSettings(
    run_seconds=0.5,
    max_peak_runs=4,
    max_points=2,
    timing_s=0.05,
    verify_seconds=1.0,
    min_queries=64,
)
#: Generous, so that a shared 2-core CI machine still meets it; the digits CNN computes a
#: batch in well under a millisecond.
BOUND_S = 0.05


@pytest.fixture(scope="module")
def zoo(small_repo: Path) -> Path:
    """The session's digits build (tests/conftest.py): tests copy it before they change it."""
    return small_repo


def _copy(zoo: Path, tmp: Path) -> Path:
    shutil.copytree(zoo / "digits", tmp / "digits")
    return tmp


@pytest.fixture(scope="module")
def tuned(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> OptimizeResult:
    repo = _copy(zoo, tmp_path_factory.mktemp("tuned"))
    settings = OptimizeSettings(
        device="cpu",
        tolerance=0.01,
        only=("int8-static-minmax",),
        runtime_stage=False,
        slo_p99_s=BOUND_S,
        meter=SHORT_METER,
        slo=SHORT_SLO,
        time_budget_s=300,
    )
    return optimize(repo, "digits", settings)


def _trial(result: OptimizeResult, name: str):  # type: ignore[no-untyped-def]
    return next(t for t in result.trials if t.variant.name == name)


def test_int8_is_accepted_within_one_point_of_fp32_on_held_out_labels(
    tuned: OptimizeResult,
) -> None:
    assert tuned.metric.value == "top1"
    assert tuned.data["labels"] and tuned.data["validation_rows"] == 360
    int8 = _trial(tuned, "int8-static-minmax")
    assert int8.status == "accepted", int8.reason
    assert int8.accuracy is not None and int8.accuracy.reference_value is not None
    # The real held-out accuracy of the INT8 file, against FP32's on the same 360 images.
    assert int8.accuracy.reference_value > 0.9
    assert abs(int8.accuracy.value - int8.accuracy.reference_value) <= 0.01
    assert int8.speed is not None and int8.speed.offline_sps > 0
    assert tuned.winner.speed is not None
    fastest = max(t.speed.offline_sps for t in tuned.trials if t.accepted and t.speed)
    if tuned.written_version is None:  # the fastest's lead, if any, was within the spread
        assert tuned.winner.variant.name == "fp32"
    else:
        assert tuned.winner.speed.offline_sps == fastest


async def test_the_written_version_loads_and_serves(tuned: OptimizeResult) -> None:
    repo_root = tuned.version_dir.parent.parent
    repo = ModelRepository(repo_root)
    config = load_config(repo_root / "digits" / "config.toml", "digits")
    served = tuned.written_version or tuned.source_version
    assert repo.version("digits").version == served
    if tuned.written_version is None:
        # FP32 won or INT8's lead was within the runs' spread: no copy of the source.
        assert tuned.winner.variant.name == "fp32" and "nothing to write" in tuned.decision
        assert not (repo_root / "digits" / "2").exists()
        assert "optimized_variant" not in config.metadata
    else:
        assert tuned.written_version == 2
        assert config.metadata["optimized_variant"] == tuned.winner.variant.name
    manager = ModelManager(repo)
    await manager.load("digits")
    try:
        data = np.load(tuned.version_dir / "validation.npz")
        # The SLO tuner may have lowered max_batch_size: requests stay within it.
        step = config.max_batch_size
        predicted = []
        for start in range(0, 64, step):
            x = data["input"][start : min(64, start + step)]
            request = InferenceRequest("digits", {"input": x})
            response = await DataPlane(manager).infer(request)
            assert response.model_version == str(served)
            predicted.append(response.outputs["output"].argmax(1))
        top1 = float(np.mean(np.concatenate(predicted) == data["labels"][:64]))
        assert top1 >= 0.9
    finally:
        await manager.close()


def test_the_report_is_beside_the_version(tuned: OptimizeResult) -> None:
    report = json.loads((tuned.version_dir / "optimize_report.json").read_text())
    assert report["winner"] == tuned.winner.variant.name
    assert report["decision"] == tuned.decision
    # Each variant measured three times: the median decides, the spread is shown.
    for trial in report["trials"]:
        assert len(trial["speed"]["offline_runs"]) == 3 and trial["speed"]["spread"] >= 0
    assert {t["name"] for t in report["trials"]} == {"fp32", "int8-static-minmax"}
    assert any(s["name"] == "fp16" for s in report["skipped"])
    assert (tuned.version_dir / "optimize.png").stat().st_size > 1000
    text = (tuned.version_dir / "optimize_report.md").read_text()
    assert "int8-static-minmax" in text and "SLO tuning" in text


def test_the_tuned_config_meets_the_bound_in_a_verification_run(tuned: OptimizeResult) -> None:
    slo = tuned.slo
    assert slo is not None
    assert sum(o.status == "measured" for o in slo.outcomes) <= SHORT_SLO.max_points + 1
    # Whether this machine held the bound during the run is a measurement (BENCHMARKS.md), not
    # something a test may assume; what the tuner does with each measurement is the test.
    if slo.winner is None or not slo.winner.peak_qps:  # a starved host held it at no point
        assert slo.note == "no measured point held the bound at any rate"
        assert slo.verification is None and slo.rate_qps is None and not slo.verified
        return
    assert any(o.status == "infeasible" or o.reason for o in slo.outcomes)  # it pruned
    assert slo.verification is not None
    attempts = slo.verification["attempts"]
    assert all(not a["valid"] for a in attempts[:-1])  # it stops at the first rate that holds
    for earlier, later in itertools.pairwise(attempts):
        assert later["target_qps"] == pytest.approx(earlier["target_qps"] * SHORT_SLO.step_down)
    assert slo.verified == attempts[-1]["valid"]
    if slo.verified:
        assert slo.rate_qps == attempts[-1]["target_qps"]
        assert attempts[-1]["p99_ms"] <= BOUND_S * 1e3  # LoadGen's VALID means the p99 held
    else:
        assert slo.rate_qps is None and len(attempts) == SHORT_SLO.verify_attempts
    config_path = tuned.version_dir.parent / "config.toml"
    config = load_config(config_path, "digits")
    point = slo.winner.point
    # What the user reads: the batching written to config.toml, and whether it was confirmed.
    said = outcome_lines(tuned, config_path)[1]
    assert said.startswith(f"SLO: wrote batching {point.label} to {config_path}")
    assert ("verified under the p99 bound" in said) == slo.verified
    assert config.max_batch_size == point.max_batch_size
    assert config.instances[0].count == point.instances
    assert config.batching.max_queue_delay_us == point.max_queue_delay_us


def test_an_impossible_tolerance_keeps_fp32_and_says_by_how_much(zoo: Path, tmp_path: Path) -> None:
    repo = _copy(zoo, tmp_path)
    settings = OptimizeSettings(
        device="cpu",
        tolerance=0.0,
        metric="maxabs",
        only=("int8-static-minmax", "int8-static-percentile"),
        runtime_stage=False,
        measure_rejected=False,
        meter=SHORT_METER,
    )
    result = optimize(repo, "digits", settings)
    assert result.winner.variant.name == "fp32"
    lossy = [t for t in result.trials if t.variant.lossy]
    assert [t.status for t in lossy] == ["rejected", "rejected"]
    for trial in lossy:
        assert trial.accuracy is not None and trial.accuracy.excess > 0
        assert f"by {trial.accuracy.excess:.2%}" in trial.reason


def test_cli_refuses_a_bad_tolerance(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", str(zoo), "digits", "--tolerance", "lots"]) == 1
    assert "expected a percentage" in capsys.readouterr().err


def test_an_only_that_names_no_variant_is_refused_naming_them(zoo: Path, tmp_path: Path) -> None:
    # A mistyped --only tried fp32 alone and said "wrote nothing", as if it had searched.
    repo = _copy(zoo, tmp_path)
    settings = OptimizeSettings(
        device="cpu", only=("int9",), runtime_stage=False, meter=SHORT_METER
    )
    with pytest.raises(OptimizeError, match=r"--only int9: no variant's name starts with it; "):
        optimize(repo, "digits", settings)
    assert not list(repo.glob("digits/*/optimize_report.md"))
