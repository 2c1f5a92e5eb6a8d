"""The catalog's integrity: every entry parses, has sources, sane units, dense at most sparse."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from dlscale.errors import ConfigError, NotFound
from dlscale.hardware.catalog import Catalog, load_catalog, match, parse_catalog
from dlscale.hardware.spec import PRECISIONS

REQUIRED = [
    "P4", "P40", "P100-SXM2", "V100-SXM2", "T4", "A2", "A10", "A16", "A30", "A40",
    "A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB",
    "L4", "L40", "L40S", "H100-SXM", "H100-PCIe", "H100-NVL", "H200-SXM", "GH200",
    "B200", "GB200", "Jetson-AGX-Orin", "Jetson-Orin-Nano", "TPU-v4", "TPU-v5e",
    "DGX-H100", "GB200-NVL72", "CPU",
]  # fmt: skip


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_required_entries_present(catalog: Catalog) -> None:
    missing = [name for name in REQUIRED if name not in catalog]
    assert missing == []


def test_every_figure_has_a_source(catalog: Catalog) -> None:
    for spec in catalog:
        for field in spec.figures():
            assert spec.source(field).strip(), f"{spec.name}.{field} has no source"


def test_dense_never_above_sparse(catalog: Catalog) -> None:
    for spec in catalog:
        for precision in PRECISIONS:
            dense = spec.peak_flops(precision)
            sparse = spec.peak_flops(precision, sparse=True)
            if dense is not None and sparse is not None:
                assert dense <= sparse, f"{spec.name} {precision}: dense {dense} > sparse {sparse}"


def test_units_are_sane(catalog: Catalog) -> None:
    for spec in catalog:
        scale = spec.count
        for precision, rate in {**spec.dense, **spec.sparse}.items():
            assert 1e10 <= rate <= 2e16 * scale, f"{spec.name} {precision}: {rate} FLOP/s"
        if spec.memory_bytes is not None:
            assert 4e9 <= spec.memory_bytes <= 300e9 * scale, spec.name
        if spec.memory_bandwidth is not None:
            assert 50e9 <= spec.memory_bandwidth <= 10e12 * scale, spec.name
        if spec.tdp_watts is not None:
            assert 10 <= spec.tdp_watts <= 1500 * scale, spec.name
        for link in (spec.interconnect, spec.host_link):
            if link is not None and link.bandwidth is not None:
                assert 1e9 <= link.bandwidth <= 2e12 * scale, spec.name


def test_precisions_are_ordered_where_tensor_cores_apply(catalog: Catalog) -> None:
    # A mistyped unit (GFLOP/s for TFLOP/s) breaks these orderings before it misleads anyone.
    for spec in catalog:
        fp64, fp32, fp16 = (spec.peak_flops(p) for p in ("fp64", "fp32", "fp16"))
        int8 = spec.peak_flops("int8")
        if fp64 and fp32:
            assert fp64 <= fp32, spec.name
        if fp32 and fp16:
            assert fp16 >= fp32, spec.name
        if fp16 and int8:
            assert int8 >= fp16, spec.name


def test_known_figures(catalog: Catalog) -> None:
    h100 = catalog.get("H100-SXM")
    assert h100.peak_flops("int8") == pytest.approx(1979e12)
    assert h100.peak_flops("fp8", sparse=True) == pytest.approx(3958e12)
    assert h100.memory_bandwidth == pytest.approx(3.35e12)
    assert h100.memory_bytes == pytest.approx(80e9)
    assert h100.tdp_watts == 700
    assert h100.interconnect is not None and h100.interconnect.kind == "nvlink"
    assert h100.interconnect.bandwidth == pytest.approx(900e9)
    assert h100.peak_flops("int4") is None  # not published: left empty
    assert catalog.get("L4").peak_flops("fp8") == pytest.approx(242.5e12)


def test_mig_profiles(catalog: Catalog) -> None:
    for name, smallest, count in [
        ("A100-SXM-40GB", "1g.5gb", 6),
        ("A100-SXM-80GB", "1g.10gb", 6),
        ("A30", "1g.6gb", 3),
        ("H100-SXM", "1g.10gb", 6),
        ("H200-SXM", "1g.18gb", 6),
    ]:
        profiles = catalog.get(name).mig_profiles
        assert len(profiles) == count and profiles[0].name == smallest, name
        assert profiles[-1].compute_fraction == 1.0
    slice_ = catalog.get("H100-SXM").mig("3g.40gb")
    assert slice_.peak_flops("int8") == pytest.approx(1979e12 * 3 / 7)
    assert slice_.memory_bandwidth == pytest.approx(3.35e12 * 40 / 80)
    with pytest.raises(ValueError, match="no MIG profile"):
        catalog.get("H100-SXM").mig("9g.1tb")


def test_systems_are_derived_from_their_member(catalog: Catalog) -> None:
    dgx = catalog.get("DGX-H100")
    assert dgx.count == 8 and dgx.member == "H100-SXM"
    assert dgx.peak_flops("bf16") == pytest.approx(8 * 989e12)
    assert dgx.source("bf16").startswith("derived: 8 x H100-SXM")
    assert dgx.peak_flops("fp8", sparse=True) == pytest.approx(32e15)  # from the datasheet
    nvl72 = catalog.get("GB200-NVL72")
    assert nvl72.peak_flops("fp8") == pytest.approx(72 * 5000e12)
    assert nvl72.peak_flops("fp32") == pytest.approx(5760e12)  # given, not derived


def test_lookup_is_case_insensitive_with_aliases(catalog: Catalog) -> None:
    assert catalog.get("h100").name == "H100-SXM"
    assert catalog.get("h100 sxm").name == "H100-SXM"
    assert catalog.get("a100").name == "A100-SXM-80GB"
    assert catalog.get("cpu").name == "CPU"
    with pytest.raises(NotFound, match="H100-SXM"):
        catalog.get("h100-sxm6")


@pytest.mark.parametrize(
    ("nvml_name", "memory", "entry"),
    [
        ("NVIDIA H100 80GB HBM3", 85.5e9, "H100-SXM"),
        ("NVIDIA H100 PCIe", 85.5e9, "H100-PCIe"),
        ("NVIDIA H100 NVL", 100e9, "H100-NVL"),
        ("NVIDIA H200", 150e9, "H200-SXM"),
        ("NVIDIA A100-SXM4-40GB", 42.4e9, "A100-SXM-40GB"),
        ("NVIDIA A100-SXM4-80GB", 85.1e9, "A100-SXM-80GB"),
        ("NVIDIA A100-PCIE-40GB", 42.4e9, "A100-PCIe-40GB"),
        ("NVIDIA A100 80GB PCIe", 85.1e9, "A100-PCIe-80GB"),
        ("NVIDIA A10", 24e9, "A10"),
        ("NVIDIA L40", 48e9, "L40"),
        ("NVIDIA L40S", 48e9, "L40S"),
        ("Tesla T4", 16e9, "T4"),
        ("Tesla V100-SXM2-16GB", 16e9, "V100-SXM2"),
        ("NVIDIA GH200 480GB", 100e9, "GH200"),
        ("NVIDIA GeForce RTX 4090", 24e9, None),
    ],
)
def test_match_nvml_names(nvml_name: str, memory: float, entry: str | None) -> None:
    found = match(nvml_name, memory)
    assert (found.name if found else None) == entry


def test_shipped_file_parses_and_bad_entries_are_named() -> None:
    text = resources.files("dlscale.hardware").joinpath("catalog.toml").read_text()
    data = tomllib.loads(text)
    assert len(parse_catalog(data)) == len(data["devices"])
    bad = {"devices": {"X1": {"vendor": "v", "kind": "gpu", "source": "s", "dense": {"fp7": 1}}}}
    with pytest.raises(ConfigError, match=r"'X1'.*fp7"):
        parse_catalog(bad)
    no_source = {"devices": {"X2": {"vendor": "v", "kind": "gpu", "dense": {"fp32": 1}}}}
    with pytest.raises(ConfigError, match=r"'X2'.*source"):
        parse_catalog(no_source)
