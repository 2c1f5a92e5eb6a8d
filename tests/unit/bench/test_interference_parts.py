"""The interference bench's parts: its scratch repository, MIG placement, the summary's ratios."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.toolkit.models import identity_graph, write_model
from tests.unit.hardware.fake_nvml import FakeGpu, FakeNvml, three_gpus

from dlscale.bench.interference import Phase
from dlscale.bench.interference_report import summarize
from dlscale.bench.tenants import TenantServer, TenantSpec, mig_pair, scratch_repository
from dlscale.hardware.detect import detect
from dlscale.models.config import load_config
from dlscale.models.config_sections import QosConfig


def test_the_scratch_repository_sets_qos_and_device_and_links_versions(tmp_path: Path) -> None:
    source = tmp_path / "repo"
    write_model(source, "small", identity_graph(), "max_batch_size = 4\n")
    original = (source / "small" / "config.toml").read_text()
    spec = TenantSpec("small", QosConfig(latency_objective_us=20_000), "MIG-aaa")
    scratch = scratch_repository(source, [spec], tmp_path / "scratch")
    config = load_config(scratch / "small" / "config.toml", "small")
    assert config.qos == QosConfig(latency_objective_us=20_000)
    assert [g.device for g in config.instances] == ["MIG-aaa"]
    assert config.max_batch_size == 4
    assert (scratch / "small" / "1").resolve() == (source / "small" / "1").resolve()
    assert (source / "small" / "config.toml").read_text() == original  # never edited


def test_mig_pair_takes_two_instances_of_one_gpu() -> None:
    first, second = mig_pair(detect(three_gpus())) or (None, None)
    assert first is not None and second is not None
    assert (first.uuid, second.uuid) == ("MIG-aaa", "MIG-bbb")
    no_mig = FakeNvml([FakeGpu("NVIDIA T4", "GPU-t4", 16 << 30)])
    assert mig_pair(detect(no_mig)) is None


def test_a_tenant_server_sees_only_its_mig_instance(tmp_path: Path) -> None:
    server = TenantServer(tmp_path, "MIG-aaa", tmp_path / "log")
    assert server.command()[1:4] == ["-m", "dlscale", "serve"]
    assert "--http-port" in server.command() and "0" in server.command()
    env = server.environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "MIG-aaa"}


def _phase(condition: str, rep: int, p99_ms: float, rate: float, **kw: float) -> Phase:
    return Phase(condition, rep, {"p99": p99_ms / 1e3}, neighbor_rate=rate, **kw)  # type: ignore[arg-type]


def test_ratios_are_each_repetitions_against_its_own_alone_phase() -> None:
    phases = [
        _phase("alone", 1, 10, 100, protected_device_s=1.0, duration_s=10.0),
        _phase("on", 1, 11, 81),
        _phase("off", 1, 30, 95),
        _phase("alone", 2, 20, 200, protected_device_s=2.0, duration_s=10.0),
        _phase("on", 2, 26, 144),
        _phase("off", 2, 50, 150),
    ]
    rows = {r["condition"]: r for r in summarize(phases, objective_s=0.025)["conditions"]}
    assert rows["alone"]["protected_share"] == pytest.approx(0.15)
    assert rows["on"]["p99_ratios"] == pytest.approx([1.1, 1.3])
    assert rows["on"]["neighbor_kept_each"] == pytest.approx(
        [0.9, 0.9]
    )  # 81 / (100 x 0.9), 144 / (200 x 0.8)
    assert rows["on"]["p99_ratio"] == pytest.approx(1.2)
    assert rows["on"]["meets_targets"] is True
    assert rows["off"]["p99_ratio"] == pytest.approx(2.75)
    assert "meets_targets" not in rows["off"]
    assert rows["on"]["within_objective"] == 1 and rows["alone"]["within_objective"] == 2
