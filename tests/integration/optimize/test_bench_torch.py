"""`dlscale bench --repo` on a torch-backend model, in process: the run and its roofline."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.hardware.cpu import cpu_spec

pytest.importorskip("torch")

from dlscale.backends.torch.files import write_module_spec
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.model import WEIGHT_SEED

#: The MLP's matrix products, 2 FLOPs per multiply-accumulate (what torch's counter counts).
MLP_FLOPS = 2 * (256 * 1024 + 1024 * 1024 + 1024 * 10)


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-repo")
    model = ZOO["mlp"]
    (root / "mlp" / "1").mkdir(parents=True)
    write_module_spec(
        root / "mlp" / "1" / "model.zoo",
        model.factory,
        {"seed": WEIGHT_SEED},
        [s.with_batch() for s in model.inputs()],
        [s.with_batch() for s in model.outputs()],
    )
    config = {"backend": "torch", "max_batch_size": 16, "backend_options": {"precision": "bf16"}}
    (root / "mlp" / "config.toml").write_text(tomli_w.dumps(config))
    return root


def test_bench_on_a_torch_model_reports_its_flops_and_precision(
    torch_repo: Path, tmp_path: Path
) -> None:
    options = BenchOptions(
        "mlp", [Scenario.OFFLINE], repo=torch_repo, duration_s=0.5, warmup_s=0.2, sample_count=64
    )
    report = bench(None, options, tmp_path)
    result = report["scenarios"][0]["result"]
    assert result["verdict"] == "VALID", result["reasons"]
    assert result["errors"]["count"] == 0
    assert report["precision"] == "bf16"
    roof = report["roofline"]
    assert roof["flops_per_sample"] == MLP_FLOPS
    assert roof["precision"] == "bf16"
    markdown = (tmp_path / "report.md").read_text()
    # The share of the roofline needs the CPU's bf16 peak, which only some CPUs publish
    # (avx512_bf16 or AMX, hardware/cpu.py): elsewhere the report says why it has none.
    if "bf16" in cpu_spec().dense:
        assert f"{MLP_FLOPS:.4g} FLOPs/sample; " in markdown and roof["share"] > 0
    else:
        assert roof.get("share") is None
        why = "roofline not computed: CPU publishes no dense bf16 peak"
        assert f"FLOPs/sample: {MLP_FLOPS:.4g}. {why}" in markdown
