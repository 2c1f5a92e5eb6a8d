"""Short real LoadGen runs against in-process models, and the CLI's errors."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dlscale.bench.report import peak_lines
from dlscale.bench.results import RunResult
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import RunSettings, Scenario
from dlscale.bench.session import SIZING_RERUNS, BenchOptions, opened
from dlscale.cli import main

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


@pytest.fixture(scope="session")
def offline_and_single(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench-out")
    options = BenchOptions(
        "identity", [Scenario.OFFLINE, Scenario.SINGLESTREAM], repo=repo, **SHORT
    )
    return bench(None, options, out)


def test_short_runs_are_valid_with_sane_numbers(offline_and_single: dict[str, Any]) -> None:
    for entry in offline_and_single["scenarios"]:
        res = entry["result"]
        assert res["verdict"] == "VALID", res["reasons"]
        assert res["loadgen"]["result"] == "VALID"
        assert res["completed"] == res["issued"] > 0
        assert res["errors"]["count"] == 0
        assert res["throughput_samples_per_s"] > 0
        lat = res["latency_s"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
        # Our timings and LoadGen's describe the same queries.
        assert lat["p50"] == pytest.approx(res["loadgen"]["latency_s"]["p50"], rel=0.5)


def test_the_report_has_what_a_reader_needs(offline_and_single: dict[str, Any]) -> None:
    report = offline_and_single
    files = report["files"]
    on_disk = json.loads(Path(files["json"]).read_text())
    assert on_disk["model"]["name"] == "identity"
    for key in ("targets", "date", "host", "packages", "roofline", "options", "warmup"):
        assert on_disk[key]
    assert on_disk["packages"]["mlcommons-loadgen"]
    assert Path(files["markdown"]).read_text().startswith("# dlscale bench: identity")
    assert Path(files["latency_png"]).stat().st_size > 1000
    logs = Path(on_disk["scenarios"][0]["result"]["log_dir"])
    assert (logs / "mlperf_log_summary.txt").is_file()
    assert (logs / "mlperf_log_detail.txt").is_file()
    profile = report["profile"]
    assert profile["model"] == "identity"
    assert all(float(v) > 0 for v in profile["batch_latency_s"].values())


#: Figures that size a run far too small on any machine. LoadGen sizes Offline's one query from
#: the expected rate: at a thousandth of a sample a second it holds one sample. It generates
#: SingleStream's queries from the expected latency: at 100 s each, too few for the duration.
FAR_TOO_SMALL = {
    Scenario.OFFLINE: {"expected_qps": 1e-3},
    Scenario.SINGLESTREAM: {"expected_latency_s": 100.0},
}


@pytest.mark.parametrize("scenario", list(FAR_TOO_SMALL), ids=lambda s: s.value)
def test_a_run_sized_far_too_small_is_rerun_until_it_lasts(
    repo: Path, tmp_path: Path, scenario: Scenario
) -> None:
    options = BenchOptions("identity", [scenario], repo=repo, **SHORT)
    runs: list[RunResult] = []
    with opened(None, options) as session:
        run = session.run

        def kept(settings: RunSettings, log_dir: Path) -> RunResult:
            runs.append(run(settings, log_dir))  # each real LoadGen run, in order
            return runs[-1]

        session.run = kept  # type: ignore[method-assign]
        tiny = replace(session.settings(scenario), **FAR_TOO_SMALL[scenario])
        result, note = session.sized_run(tiny, tmp_path)
    # Every run but the last ended early, each sized at least twice as large as the one before.
    assert 2 <= len(runs) <= 1 + SIZING_RERUNS and result is runs[-1]
    assert all(r.reasons[0] == "Min duration satisfied: NO" for r in runs[:-1])
    expected = [r.settings.expected_qps or 0.0 for r in runs]
    latency = [r.settings.expected_latency_s or 0.0 for r in runs]
    assert all(b >= 2 * a for a, b in itertools.pairwise(expected)), expected
    assert all(b <= a / 2 for a, b in itertools.pairwise(latency)), latency
    assert note == f"rerun {len(runs) - 1}x, sized up: a run ended before the minimum duration"
    assert result.valid, result.reasons


def test_an_unmeetable_latency_bound_is_invalid(repo: Path, tmp_path: Path) -> None:
    options = BenchOptions(
        "identity",
        [Scenario.SERVER],
        repo=repo,
        target_qps=200.0,
        latency_bound_s=1e-6,
        min_query_count=50,
        **SHORT,
    )
    res = bench(None, options, tmp_path)["scenarios"][0]["result"]
    assert res["verdict"] == "INVALID"
    assert "Performance constraints satisfied: NO" in res["reasons"]


def test_accuracy_mode_catches_a_model_that_answers_wrong(repo: Path, tmp_path: Path) -> None:
    reference = repo / "identity" / "1" / "model.onnx"
    options = BenchOptions(
        "broken", [Scenario.OFFLINE], repo=repo, accuracy=True, reference=reference, **SHORT
    )
    res = bench(None, options, tmp_path)["scenarios"][0]["result"]
    acc = res["accuracy"]
    assert acc["ok"] is False and acc["passed"] == 0 and acc["checked"] == acc["samples"] == 64
    assert acc["max_abs_error"] == pytest.approx(1.0)
    assert res["verdict"] == "INVALID"
    assert (Path(res["log_dir"]) / "accuracy" / "mlperf_log_accuracy.json").stat().st_size > 100


def test_accuracy_mode_passes_a_correct_model(repo: Path, tmp_path: Path) -> None:
    options = BenchOptions("identity", [Scenario.SINGLESTREAM], repo=repo, accuracy=True, **SHORT)
    acc = bench(None, options, tmp_path)["scenarios"][0]["result"]["accuracy"]
    assert acc["ok"] is True and acc["passed"] == acc["checked"] == 64


def _peak_search(repo: Path, tmp_path: Path, bound_s: float) -> tuple[dict[str, Any], str]:
    """A find-peak of three runs at most; 16 queries a run keep a slow host's search short (at
    the floor of 1 query/s a run lasts 16 s)."""
    options = BenchOptions(
        "identity", [Scenario.SERVER], repo=repo, find_peak=True, max_peak_runs=3,
        latency_bound_s=bound_s, min_query_count=16, **SHORT,
    )  # fmt: skip
    report = bench(None, options, tmp_path)
    assert Path(report["files"]["sweep_png"]).is_file()
    (line,) = peak_lines(report)
    return report["scenarios"][0], line


def test_find_peak_doubles_the_rate_while_runs_meet_the_bound(repo: Path, tmp_path: Path) -> None:
    # A bound of 10 s holds on any machine, however slow: the search only ramps up.
    entry, line = _peak_search(repo, tmp_path, bound_s=10.0)
    rates = [p["target_qps"] for p in entry["sweep"]]
    said = [(p["target_qps"], p["p99_s"], p["reasons"]) for p in entry["sweep"]]
    assert len(rates) == 3 and all(p["valid"] for p in entry["sweep"]), said
    assert rates == pytest.approx([rates[0], 2 * rates[0], 4 * rates[0]])
    assert entry["peak_qps"] == rates[-1]
    assert line.startswith(f"peak: {entry['peak_qps']:,.1f} queries/s with p99 ")


def test_find_peak_halves_the_rate_to_the_floor_when_no_run_meets_the_bound(
    repo: Path, tmp_path: Path
) -> None:
    # A bound of 1 ns no answer meets: the search halves from its start, never below 1 query/s.
    entry, line = _peak_search(repo, tmp_path, bound_s=1e-9)
    rates = [p["target_qps"] for p in entry["sweep"]]
    start = rates[-1]
    expected = sorted(start / 2**k for k in range(3) if start / 2**k >= 1.0)
    assert rates == pytest.approx(expected)
    assert not any(p["valid"] for p in entry["sweep"])
    assert entry["peak_qps"] is None
    assert line.startswith("peak: no rate met the p99 bound")


def test_cli_unknown_model_is_a_clear_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--repo", str(repo), "--model", "nope", "--duration", "1s"])
    err = capsys.readouterr().err
    assert code == 1
    assert "no model 'nope'" in err and "identity" in err and "Traceback" not in err


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "grpc://127.0.0.1:9"])
def test_cli_unreachable_target_is_a_clear_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", url, "--model", "identity", "--scenario", "offline"])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot reach" in err and "Traceback" not in err


def test_cli_flags_before_and_after_the_target_both_count(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["bench", "--model", "identity", "--repo", str(repo), "--scenario", "singlestream",
         "--duration", "0.3s", "--out", str(tmp_path), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["scenarios"][0]["scenario"] == "SingleStream"
    assert "VALID" in capsys.readouterr().out


def test_cli_refuses_two_targets_without_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "http://a:1", "http://b:2", "--model", "identity"])
    assert code == 1
    assert "bench compare" in capsys.readouterr().err


def test_cli_says_each_long_step_as_it_begins(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A user waited 40-54 s before LoadGen and 20 s after it with nothing on the screen.
    code = main(
        ["bench", "--repo", str(repo), "--model", "identity", "--scenario", "offline",
         "--duration", "0.5s", "--samples", "64", "--out", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    steps = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]
    assert steps[0].startswith("in-process") and "opening identity" in steps[0]
    assert steps[1].startswith("warm-up: ")
    assert steps[2].startswith("Offline: LoadGen runs")
    assert steps[-1] == f"writing the report and plots into {tmp_path}"
