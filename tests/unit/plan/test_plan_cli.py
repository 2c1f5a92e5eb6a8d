"""The plan verbs as a user runs them (catalog-free paths: --peak-tflops, stated FLOPs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.cli import main, parse


def test_plan_train_prints_the_plan_and_the_deadline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The DeepSpeech2-era cycle (1e19 FLOPs, 4.09 TB) on 4 nodes of 8 GPUs over NDR InfiniBand.
    argv = [
        "plan", "train", "--flops-per-sample", "1e13", "--samples", "1000000",
        "--gpus", "8", "--nodes", "4", "--peak-tflops", "989", "--inter", "ib-400g",
        "--mfu", "0.4", "--gradient-bytes", "1.2e9", "--overlap", "0.5",
        "--batch-per-gpu", "4", "--bytes-per-sample", "4.09e6", "--deadline", "8h",
        "--plot", str(tmp_path / "scaling.png"),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "32 x 989 TFLOP/s GPU" in out
    assert "to finish in 8h" in out
    assert "347.2 TFLOP/s sustained, 142.0 MB/s" in out
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_train_rejects_unknown_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "train", "--flops-per-sample", "1e9", "--samples", "10"]
    assert main([*argv, "--peak-tflops", "100", "--intra", "nvlink9"]) == 1
    assert "unknown fabric 'nvlink9'" in capsys.readouterr().err


def test_plan_serve_needs_a_workload(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "serve", "--qps", "100", "--p99", "15ms", "--flops-per-sample", "8e9"]
    assert main(argv) == 1
    assert "--bytes-per-sample" in capsys.readouterr().err


def test_bench_allreduce_arguments() -> None:
    args = parse(["bench", "allreduce", "--nproc", "4", "--sizes", "1K:1M"])
    assert (args.nproc, args.backend, args.sizes, args.iters) == (4, "gloo", "1K:1M", 20)


def test_plan_serve_with_catalog_devices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_json = tmp_path / "plans.json"
    argv = [
        "plan", "serve", "--flops-per-sample", "8.18e9", "--bytes-per-sample", "3e7",
        "--qps", "5000", "--p99", "15ms", "--devices", "L4,A100-SXM", "--max-batch", "4",
        "--price", "L4=0.8,A100-SXM=1.8", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "L4" in out and "A100-SXM-80GB" in out
    plans = {p["device"]: p for p in json.loads(out_json.read_text())}
    # L4 is memory-bound at 0.3e12 / 3e7 = 10,000/s x 0.4 = 4,000/s at most: 2 or more of them
    assert plans["L4"]["devices"] >= 2
    assert plans["L4"]["cost_per_million"] is not None  # price found through the alias
    assert plans["A100-SXM-80GB"]["cost_per_million"] is not None


def test_plan_serve_notes_a_profile_without_small_batches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # An Offline bench run times only the large batches it formed.
    profile = {
        "model": "m",
        "device": "L4",
        "precision": "fp32",
        "batch_latency_s": {"250": 0.024, "256": 0.031},
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"format": "dlscale-bench/1", "profile": profile}))
    argv = [
        "plan", "serve", "--flops-per-sample", "1e6", "--bytes-per-sample", "1e6",
        "--qps", "20000", "--p99", "100ms", "--devices", "L4", "--profile", str(path),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "profile starts at batch 250" in out
    assert "measured on L4" in out
