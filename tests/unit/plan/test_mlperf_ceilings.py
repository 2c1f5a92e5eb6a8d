"""No published MLPerf result beats the ceiling dlscale computes for it: a roofline is an upper
bound, and a ceiling that a real result beats is wrong.

Before the batch was taken into account, `dlscale roofline resnet50 --device H100-SXM
--precision int8` said "memory-bound, 64,266 samples/s" (the weights read once per sample),
while MLPerf measured 91,826 on that GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.roofline import batch_roofline, best_roofline
from dlscale.models.cost import ModelCost
from dlscale.models.flops import count

#: ResNet-50 INT8, images/s per accelerator, closed division (datacenter; Orin: edge), as
#: shared/reference/mlperf.md lists them from mlcommons/inference_results_v3.0 and _v4.1
#: (closed/<submitter>/results/): (catalog name, round, Offline, Server or None).
RESNET50_INT8 = [
    ("H100-SXM", "v3.0", 91_826, 76_002),
    ("H200-SXM", "v4.1", 96_029, 85_167),
    ("H100-PCIe", "v3.0", 56_635, 47_001),
    ("A100-SXM-80GB", "v3.0", 42_379, 37_504),
    ("L40S", "v4.1", 45_153, 45_308),
    ("L4", "v3.0", 13_158, 12_198),
    ("Jetson-AGX-Orin", "v3.0 edge", 6_438, None),
]


@pytest.fixture(scope="module")
def resnet50(big_zoo: Path) -> ModelCost:
    return count(big_zoo / "resnet50" / "1" / "model.onnx")


@pytest.mark.parametrize(("device", "round_", "offline", "server"), RESNET50_INT8)
def test_no_mlperf_resnet50_result_beats_the_ceiling(
    resnet50: ModelCost, device: str, round_: str, offline: int, server: int | None
) -> None:
    spec = load_catalog().get(device)
    traffic = resnet50.traffic("int8")
    ceiling = best_roofline(spec, "int8", resnet50.flops, traffic).attainable_rate
    for measured in (offline, server):
        if measured is not None:
            assert measured <= ceiling, f"{device} MLPerf {round_}: {measured:,} > {ceiling:,.0f}"
    # A larger batch never lowers the ceiling; 2048 is what the Offline records used.
    large = batch_roofline(spec, "int8", resnet50.flops, traffic, 2048).attainable_rate
    assert large >= ceiling * 0.999


def test_the_command_shows_the_best_batch(
    big_zoo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["roofline", "resnet50", "--repo", str(big_zoo), "--device", "H100-SXM"]
    assert main([*argv, "--precision", "int8"]) == 0
    out = capsys.readouterr().out
    assert "batch 1:" in out and "best batch" in out and "compute-bound" in out
