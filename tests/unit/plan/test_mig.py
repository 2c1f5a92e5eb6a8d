"""MIG layouts against the catalog's profiles, and their mapping onto the NVML stand-in's GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.hardware.fake_nvml import three_gpus

from dlscale.cli import build_parser, main
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.detect import detect
from dlscale.hardware.spec import DeviceSpec
from dlscale.plan.mig import MigGpu, MigLayout, MigTenant, assign, memory_slices, pack, plan_mig
from dlscale.plan.mig_commands import parse_tenant
from dlscale.plan.serve import ServiceCurve, Workload, roofline_curve

H100 = load_catalog().get("H100-SXM")
# ResNet-50-like: 8.18 GFLOP a sample, 25 MB of weights shared by a batch, 5 MB per sample.
RESNETISH = Workload("resnetish", 8.18e9, lambda _p, b: 25e6 / b + 5e6)


def _tenant(name: str, qps: float, p99_s: float, memory: float = 0.0) -> MigTenant:
    def curve(device: DeviceSpec) -> ServiceCurve:
        return roofline_curve(device, RESNETISH, "int8", 0.4, 64)

    return MigTenant(name, qps, p99_s, curve, memory)


@pytest.mark.parametrize(
    ("name", "slices"), [("H100-SXM", 8), ("H200-SXM", 8), ("A100-SXM-40GB", 8), ("A30", 4)]
)
def test_memory_slices_of_each_mig_gpu(name: str, slices: int) -> None:
    assert memory_slices(load_catalog().get(name))[0] == slices


def test_a_light_tenant_gets_the_smallest_profile_and_load_never_shrinks_it() -> None:
    light = plan_mig(H100, [_tenant("light", 200, 0.015)]).placements[0]
    assert (light.profile, light.instances) == ("1g.10gb", 1)
    slices = [plan_mig(H100, [_tenant("t", q, 0.015)]).compute_slices for q in (200, 4000, 16000)]
    assert slices == sorted(slices) and slices[-1] > slices[0]


def test_a_memory_need_rules_out_smaller_profiles() -> None:
    placed = plan_mig(H100, [_tenant("big-weights", 200, 0.015, memory=30e9)]).placements[0]
    assert placed.profile in ("3g.40gb", "4g.40gb", "7g.80gb")


def test_instances_pack_within_slices_and_instance_limits() -> None:
    one = plan_mig(H100, [_tenant("t", 200, 0.015)]).placements[0]
    seven = pack(H100, [one] * 7)
    assert len(seven) == 1 and seven[0].compute_slices == 7
    assert len(pack(H100, [one] * 8)) == 2
    three_big = [one.__class__(**{**one.__dict__, "profile": "3g.40gb", "compute_slices": 3,
                                  "memory_slices": 4})] * 3  # fmt: skip
    gpus = pack(H100, three_big)
    assert [len(g.instances) for g in gpus] == [2, 1]  # two 3g.40gb per GPU at most


def test_an_objective_no_profile_meets_is_reported() -> None:
    layout = plan_mig(H100, [_tenant("impossible", 100, 1e-6), _tenant("fine", 100, 0.015)])
    assert layout.unplaceable == ["impossible"]
    assert [p.tenant for p in layout.placements] == ["fine"]


def test_the_layout_maps_onto_the_hosts_mig_instances() -> None:
    h100 = detect(three_gpus()).gpus[0]  # MIG on: 3g.40gb MIG-aaa, 1g.10gb MIG-bbb
    layout = MigLayout(
        "H100-SXM", [], [MigGpu([("resnet50", "3g.40gb"), ("mlp", "1g.10gb")], 4, 5)], []
    )
    assert assign(layout, h100) == {"resnet50": ["MIG-aaa"], "mlp": ["MIG-bbb"]}
    twice = MigLayout("H100-SXM", [], [MigGpu([("a", "3g.40gb"), ("b", "3g.40gb")], 6, 8)], [])
    assert assign(twice, h100) is None  # the GPU must be partitioned differently first
    a100 = detect(three_gpus()).gpus[1]  # MIG off
    assert assign(layout, a100) is None


def test_plan_serve_mig_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "layout.json"
    tenant = "name=vision,flops=8.18e9,bytes=3e7,qps=200,p99=15ms"
    args = ["plan", "serve", "--mig", "H100-SXM", "--tenant", tenant, "--precision", "int8"]
    assert main([*args, "--json", str(out)]) == 0
    assert "GPU 1: 1g" in capsys.readouterr().out
    layout = json.loads(out.read_text())
    assert layout["placements"][0]["tenant"] == "vision" and layout["assignment"] is None
    assert main(["plan", "serve", "--mig", "H100-SXM", "--tenant", "qps=1"]) == 1
    assert "give qps= and p99=" in capsys.readouterr().err
    assert main(["plan", "serve", "--mig", "L4", "--tenant", tenant]) == 1
    assert "no MIG profiles" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("qps=fast", "qps must be a number"),
        ("flops=lots", "flops must be a number"),
        ("bytes=some", "bytes must be a number"),
        ("memory=abc", "memory size 'abc'"),
        ("memory=1e9", "memory size '1e9'"),  # sizes are written with a unit, as in [memory]
        ("memory=20XB", "memory size '20XB'"),
    ],
)
def test_a_tenants_value_that_is_not_a_number_is_named(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was a ValueError traceback once; the memory size now reads as a server's [memory] does.
    tenant = ",".join(["flops=8.18e9", "bytes=3e7", "qps=200", "p99=15ms", value])
    assert main(["plan", "serve", "--mig", "H100-SXM", "--tenant", tenant]) == 1
    assert message in capsys.readouterr().err


def test_a_tenants_memory_is_read_in_decimal_and_binary_units() -> None:
    args = build_parser().parse_args(["plan", "serve", "--mig", "H100-SXM"])
    for memory, expected in (("20GB", 20e9), ("20GiB", 20 * 2**30), ("512MiB", 2**29)):
        tenant = parse_tenant(f"flops=1e9,bytes=1e6,qps=1,p99=1s,memory={memory}", args)
        assert tenant.memory_bytes == expected
