"""benchmarks/torch_gpu.py's pipeline on the CPU (its dry run), and how it judges the targets.

The figures of a CPU run say nothing about a GPU; what is checked is that the one command a GPU
host runs goes through serving, checking and reporting, and that the verdicts read the rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.toolkit.benchmarks import run_benchmark

#: A saved report, as the script writes it, less what judging does not read: its rows are the
#: figures the test asserts on (JSON keys are text: the instance counts too).
SAVED = {
    "device": "test", "torch": "-", "cuda": None, "batch": 256, "reps": 3,
    "seconds_per_run": 2.0, "took_s": 1.0,
    "rows": [
        {"model": "resnet50", "variant": "package fp16", "kind": "package", "precision": "fp16",
         "inputs": "uint8", "offline": {"1": 30_000.0}},
        {"model": "resnet50", "variant": "package fp8", "kind": "package", "precision": "fp8",
         "inputs": "uint8", "offline": {"2": 40_000.0}, "agreement": 0.98},
    ],
}  # fmt: skip


def test_the_dry_run_serves_checks_and_reports(tmp_path: Path) -> None:
    argv = ["--device", "cpu", "--batch", "8", "--seconds", "0.1", "--reps", "2"]
    argv += ["--packages", "--eager", "mlp:fp32", "mlp:bf16", "--instances", "1", "2"]
    argv += ["--no-reference", "--out", str(tmp_path)]
    done = run_benchmark("torch_gpu", *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "torch_gpu.json").read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    fp32, bf16 = rows["eager fp32 (fp32 in)"], rows["eager bf16 (fp32 in)"]
    assert fp32["status"] == bf16["status"] == "ok"
    assert set(fp32["offline"]) == {"1", "2"} and len(fp32["runs"]["1"]) == 2
    assert fp32["direct"] > 0 and fp32["load_s"] > 0
    # FP32 answers are the reference: BF16's are compared with them.
    assert fp32["cosine"] == pytest.approx(1.0) and 0.99 < bf16["cosine"] <= 1.0 + 1e-9
    markdown = (tmp_path / "torch_gpu.md").read_text()
    assert "| mlp | eager bf16 (fp32 in) |" in markdown and "## Targets" in markdown


def test_targets_are_judged_on_what_was_measured(tmp_path: Path) -> None:
    # The verdicts of a saved report, judged again as a user does (`torch_gpu judge`): tests run
    # benchmarks/ as commands and never import it (DESIGN.md).
    (tmp_path / "torch_gpu.json").write_text(json.dumps(SAVED))
    done = run_benchmark("torch_gpu", "judge", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads((tmp_path / "torch_gpu.json").read_text())
    said, TARGETS = answer["verdicts"], answer["targets"]
    assert said[0].startswith("resnet50 FP16 through the batcher: 30,000/s") and "(met)" in said[0]
    assert "not measured in this run" in said[1]  # no bert-base row
    assert "40,000/s" in said[2] and "not met" in said[2]  # 98% agreement < 99%
    assert TARGETS["bert-base"] == 15_600
    assert [r["best"] for r in answer["rows"]] == [30_000.0, 40_000.0]
    assert (
        f"- {said[0]}" in done.stdout and f"- {said[0]}" in (tmp_path / "torch_gpu.md").read_text()
    )
