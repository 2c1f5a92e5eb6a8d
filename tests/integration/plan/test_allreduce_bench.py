"""A real 2-process gloo all-reduce on CPU: timed, compared with the model, values checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlscale.cli import main


def test_two_process_gloo_allreduce(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "allreduce.json", tmp_path / "allreduce.png"
    argv = [
        "bench", "allreduce", "--nproc", "2", "--sizes", "4K:64K", "--iters", "3",
        "--warmup", "1", "--json", str(out_json), "--plot", str(out_png),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out_json.read_text())
    sizes = [4096, 8192, 16384, 32768, 65536]
    assert [r["nbytes"] for r in report["rows"]] == sizes
    # every size was all-reduced and compared element by element twice (before and after timing)
    assert report["values_checked"] == sum(2 * s // 4 for s in sizes)
    for row in report["rows"]:
        assert row["seconds"] > 0 and row["predicted_s"] > 0
        assert row["busbw"] == pytest.approx(row["algbw"])  # 2(n-1)/n = 1 at n = 2
        assert row["predicted_algorithm"] == "ring/simple"
    assert report["fabric"] == "loopback"
    assert out_png.read_bytes()[:4] == b"\x89PNG"
    assert "reduced values checked" in capsys.readouterr().out
