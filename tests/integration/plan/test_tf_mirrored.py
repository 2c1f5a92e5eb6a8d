"""TensorFlow MirroredStrategy on 2 virtual CPU devices: the all-reduce timed and checked beside
the cost model, and a training step beside the planner's data-parallel prediction."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tests.toolkit.slow import slow_only

from dlscale.cli import main

pytestmark = [
    pytest.mark.slow,  # two TensorFlow child processes, ~15 s each on 2 cores
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="needs the [tensorflow] extra"
    ),
]


def test_bench_allreduce_on_tf_mirrored(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "allreduce.json"
    argv = [
        "bench", "allreduce", "--backend", "tf-mirrored", "--nproc", "2", "--sizes", "4K:16K",
        "--iters", "3", "--warmup", "1", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out_json.read_text())
    sizes = [4096, 8192, 16384]
    assert report["backend"] == "tf-mirrored" and report["fabric"] == "host-memory"
    assert [r["nbytes"] for r in report["rows"]] == sizes
    # every replica's every element was compared, before and after the timed calls
    assert report["values_checked"] == sum(2 * 2 * s // 4 for s in sizes)
    for row in report["rows"]:
        assert row["seconds"] > 0 and row["predicted_s"] > 0
    assert "reduced values checked" in capsys.readouterr().out


@slow_only("a second TensorFlow child process training on 1 and 2 replicas: ~20 s on 2 cores")
def test_plan_train_sets_a_measured_mirrored_step_beside_its_prediction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "train", "--flops-per-sample", "1e9", "--samples", "1e6", "--tf-mirrored", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "TensorFlow MirroredStrategy, 2 virtual CPU devices" in out
    assert "measured / predicted" in out and "planner predicts" in out
