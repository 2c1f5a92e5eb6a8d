"""`dlscale roofline` as a user runs it (in-process; stated FLOPs and bytes, no model built)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_roofline_with_explicit_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "roofline", "resnet50", "--device", "H100-SXM", "--precision", "int8",
        "--flops", "8.18G", "--bytes", "0", "--measured", "91826", "--json",
    )  # fmt: skip
    assert code == 0
    line = json.loads(out)
    assert line["attainable_rate"] == pytest.approx(241_932, rel=1e-5)
    assert line["bound"] == "compute" and line["share"] == pytest.approx(0.38, abs=0.005)
    code, out, _ = _run(
        capsys, "roofline", "resnet50", "--device", "L4", "--precision", "int8",
        "--flops", "8.18G", "--bytes", "60M",
    )  # fmt: skip
    assert code == 0 and "memory-bound" in out and "5,000 samples/s" in out


def test_roofline_errors_are_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "roofline", "nomodel", "--repo", str(tmp_path), "--device", "T4")
    assert code == 1 and "no ONNX file for model" in err and "--flops" in err
    code, _, err = _run(capsys, "roofline", "m", "--device", "T4", "--precision", "fp8",
                        "--flops", "1G", "--bytes", "1M")  # fmt: skip
    assert code == 1 and "T4 publishes no dense fp8" in err
    with pytest.raises(SystemExit):
        main(["roofline", "m", "--flops", "lots"])
