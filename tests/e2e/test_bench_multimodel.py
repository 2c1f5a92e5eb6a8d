"""`dlscale bench multimodel` as a user runs it: copies of a model, both servers, the report."""

from __future__ import annotations

import json
from pathlib import Path

from tests.toolkit.cli import run_cli
from tests.toolkit.models import write_null_model

CONFIG = (
    'max_batch_size = 4\nwarmup = []\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
MiB = 2**20


def test_bench_multimodel_reports_both_servers_within_the_budget(tmp_path: Path) -> None:
    folder = write_null_model(tmp_path / "repo", "m", CONFIG)
    with open(folder / "1" / "pad.bin", "wb") as pad:
        pad.truncate(8 * MiB)  # each copy holds at least 8 MiB: a 20 MiB budget fits two of 4
    out = tmp_path / "out"
    done = run_cli(
        "bench", "multimodel", "--repo", str(tmp_path / "repo"), "--model", "m",
        "--copies", "4", "--memory-budget", "cpu=20MiB", "--rate", "20", "--duration", "3s",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "## budget" in done.stdout
    every, budget = json.loads((out / "report.json").read_text())
    assert every["phase"] == "all-resident" and every["loads"] == 0
    assert budget["answered"] > 0 and budget["loads"] >= 2 and budget["mean_load_s"] is not None
    assert budget["samples"] > 0 and budget["samples_over_budget"] == 0
    assert budget["max_resident_bytes"] <= 20 * MiB
    assert set(budget["models"]) <= {f"m-{i:03d}" for i in range(4)}
    assert (out / "over-time.png").stat().st_size > 0
