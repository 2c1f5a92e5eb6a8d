"""The verbs a user types, run as the `dlscale` command: demo, plan (catalog device, counted
model), optimize. What each prints and writes is checked against what it should have used."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.toolkit.cli import run_cli

from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.roofline import roofline
from dlscale.models.flops import count
from dlscale.optimize.variants import detect_caps, model_facts, precision_variants


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1).replace(",", ""))


# -- demo ------------------------------------------------------------------------------------------


def test_demo_quick_runs_the_tour(small_repo: Path, tmp_path: Path) -> None:
    # The zoo it needs is built already (a copy of the session's small repository): the tour
    # reuses it, and adds the small JPEG pipeline to the copy.
    zoo = tmp_path / "zoo"
    shutil.copytree(small_repo, zoo)
    done = run_cli("demo", "--quick", "--dir", str(zoo), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "building zoo models" not in out
    assert "1. In-process on this CPU" in out
    for model in ("identity", "mlp", "digits"):
        assert re.search(rf"│ {model} +│", out), model
    assert "2. Serving ['identity', 'mlp', 'digits', 'smallcnn-e2e-image'," in out
    right, total = (
        int(n) for n in re.search(r"digits through REST: (\d+)/(\d+) held-out", out).groups()
    )
    assert total > 0 and right / total >= 0.9  # the zoo's digits scores about 97%
    # One JPEG through the pipeline: its five labels, the first its true class.
    shown = re.search(
        r"drawn from class (pattern-\d\d)\) in, its top-5 out in [\d.]+ ms:\n"
        r"((?: +\S+ +[-\d.]+\n){5})",
        out,
    )
    assert shown, out
    assert shown.group(2).split()[0] == shown.group(1)
    assert "4. MLPerf LoadGen through the server: mlp, Offline and Server" in out
    report = json.loads((tmp_path / ".dlscale" / "demo-bench" / "report.json").read_text())
    assert [s["scenario"] for s in report["scenarios"]] == ["Offline", "Server"]
    assert all(s["result"]["errors"]["count"] == 0 for s in report["scenarios"])


# -- plan ------------------------------------------------------------------------------------------


def test_plan_train_takes_the_catalog_device_by_default() -> None:
    done = run_cli("plan", "train", "--flops-per-sample", "1e13", "--samples", "1e6")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("8 x H100-SXM (bf16): 1 node(s) x 8 GPU(s), MFU 0.4\n")
    peak = load_catalog().get("H100-SXM").peak_flops("bf16")
    assert peak
    # Eight GPUs at 40% of the catalog's BF16 peak, less the little all-reduce time exposed.
    sustained = _number(r"sustained +([\d.,]+) TFLOP/s", out) * 1e12
    assert sustained == pytest.approx(8 * 0.4 * peak, rel=0.01)
    assert _number(r"steps +(\d+) \(global batch 256\)", out) == 3907  # 1e6 / 256, rounded up


def test_plan_train_refuses_a_precision_the_device_lacks() -> None:
    done = run_cli("plan", "train", "--flops-per-sample", "1e9", "--samples", "10",
                   "--device", "T4", "--precision", "fp8")  # fmt: skip
    assert done.returncode == 1
    assert "T4 has no published fp8 peak" in done.stderr and "Traceback" not in done.stderr


def test_plan_serve_counts_the_model_it_is_given(small_repo: Path, tmp_path: Path) -> None:
    plans_file = tmp_path / "plans.json"
    done = run_cli("plan", "serve", "--model", "mlp", "--repo", str(small_repo), "--qps", "1000",
                   "--p99", "15ms", "--json", str(plans_file))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mlp at 1000 requests/s, p99 <= 15 ms, int8;")
    plans = {p["device"]: p for p in json.loads(plans_file.read_text())}
    assert list(plans) == ["H100-SXM", "H200-SXM", "A100-SXM-80GB", "L40S", "L4", "T4"]
    # Each device's rate is 40% of its roofline for the FLOPs and bytes counted in mlp's graph
    # at the largest batch (within 1%: the queueing model's own rounding).
    cost = count(small_repo / "mlp" / "1" / "model.onnx")
    for name, plan in plans.items():
        ceiling = roofline(load_catalog().get(name), "int8", cost.flops,
                           cost.bytes_per_sample("int8", plan["max_batch"]))  # fmt: skip
        assert plan["peak_rate_per_device"] == pytest.approx(
            0.4 * ceiling.attainable_rate, rel=0.01
        )
        assert plan["devices"] == 1 and name in done.stdout


def test_plan_serve_with_a_missing_model_file_is_a_message() -> None:
    done = run_cli("plan", "serve", "--model", "/nowhere/model.onnx", "--qps", "1", "--p99", "1s")
    assert done.returncode == 1
    assert "no ONNX file at /nowhere/model.onnx" in done.stderr
    assert "Traceback" not in done.stderr


# -- optimize --------------------------------------------------------------------------------------


def test_optimize_judges_each_variant_and_writes_the_winner(
    small_repo: Path, tmp_path: Path
) -> None:
    shutil.copytree(small_repo / "mlp", tmp_path / "mlp")
    # A tight tolerance: INT8 is judged on the data (its agreement is about 99%), and rejected
    # variants get no runtime stage, which keeps this short.
    done = run_cli(
        "optimize", str(tmp_path), "mlp", "--device", "cpu", "--only", "int8-dynamic",
        "--tolerance", "0.5%", "--metric", "agreement", "--time-budget", "5m",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # The report lies beside the Markdown one the command names, in version 2 when a variant
    # won, else beside the kept FP32 source (no copy of it is written).
    markdown = Path(re.findall(r"report: (\S+)", done.stdout)[-1])
    report = json.loads((markdown.parent / "optimize_report.json").read_text())
    version = tmp_path / "mlp" / "2"
    assert (report["device"], report["metric"], report["tolerance"]) == ("cpu", "agreement", 0.005)
    trials = {t["name"]: t for t in report["trials"]}
    # INT8 is offered where the detected CPU runs it (AVX2 or better); elsewhere it says why not.
    offered, _ = precision_variants(
        model_facts(version.parent / "1" / "model.onnx"), detect_caps("cpu"), has_calibration=True
    )
    if any(v.name == "int8-dynamic" for v in offered):
        assert {"fp32", "int8-dynamic"} <= set(trials)
    else:
        assert set(trials) == {"fp32"}
        assert any(s["name"] == "int8-*" for s in report["skipped"])
    for name, trial in trials.items():
        # Stage two tunes only the stage-one winner; --only keeps the rest out.
        assert name in ("fp32", "int8-dynamic") or name.startswith("int8-dynamic+"), name
        accuracy = trial["accuracy"]
        assert accuracy["metric"] == "agreement" and accuracy["tolerance"] == 0.005
        within = accuracy["deviation"] <= 0.005
        assert trial["status"] == ("accepted" if within else "rejected"), trial["reason"]
        assert f"  {name} {trial['status']}: " in done.stdout
    accepted = {
        n: t["speed"]["offline_sps"] for n, t in trials.items() if t["status"] == "accepted"
    }
    winner = max(accepted, key=lambda n: accepted[n])
    assert report["winner"] == winner
    if winner == "fp32":
        assert not version.exists() and "wrote nothing: mlp version 1 stays" in done.stdout
        return
    assert f"winner: {winner} (" in done.stdout
    assert (version / "model.onnx").is_file()
    config = (tmp_path / "mlp" / "config.toml").read_text()
    assert f'optimized_variant = "{winner}"' in config and "optimized_from_version = 1" in config
