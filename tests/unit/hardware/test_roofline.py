"""The roofline: ceilings, the bound that applies, the measured share."""

from __future__ import annotations

import math

import pytest

from dlscale.errors import InvalidInput, Unsupported
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.roofline import batch_roofline, best_roofline, roofline
from dlscale.types import Traffic

RESNET50_FLOPS = 8.18e9  # 4.09 GMAC per 224x224 image (shared/reference/accelerators.md)


def test_resnet50_int8_ceiling_on_h100_sxm() -> None:
    line = roofline(load_catalog().get("H100-SXM"), "int8", RESNET50_FLOPS, 0)
    # 1979 TOP/s / 8.18 GOP = 241,932 img/s
    assert line.compute_bound_rate == pytest.approx(1979e12 / 8.18e9)
    assert line.attainable_rate == pytest.approx(241_932, rel=1e-5)
    assert line.bound == "compute"
    assert line.memory_bound_rate == math.inf
    # MLPerf v3.0 H100 SXM ResNet-50 Offline: 91,826 img/s = 38% of the ceiling
    assert line.share(91_826) == pytest.approx(0.38, abs=0.005)


def test_memory_bound_when_bytes_dominate() -> None:
    l4 = load_catalog().get("L4")
    line = roofline(l4, "int8", RESNET50_FLOPS, 60e6)
    assert line.memory_bound_rate == pytest.approx(300e9 / 60e6)
    assert line.compute_bound_rate == pytest.approx(242.5e12 / RESNET50_FLOPS)
    assert line.bound == "memory"
    assert line.attainable_rate == line.memory_bound_rate
    assert line.arithmetic_intensity < (line.ridge_point or 0)
    as_dict = line.to_dict(measured_rate=2500)
    assert as_dict["bound"] == "memory" and as_dict["share"] == pytest.approx(0.5)


def test_bound_switches_at_the_ridge_point() -> None:
    a100 = load_catalog().get("A100-SXM-80GB")
    peak, bandwidth = a100.peak_flops("fp16"), a100.memory_bandwidth
    assert peak is not None and bandwidth is not None
    ridge = peak / bandwidth
    below = roofline(a100, "fp16", 1e9, 1e9 / (ridge * 0.9))
    above = roofline(a100, "fp16", 1e9, 1e9 / (ridge * 1.1))
    assert (below.bound, above.bound) == ("memory", "compute")


def test_unpublished_precision_and_bad_numbers_are_errors() -> None:
    t4 = load_catalog().get("T4")
    with pytest.raises(Unsupported, match="T4 publishes no dense fp8"):
        roofline(t4, "fp8", 1e9, 0)
    with pytest.raises(InvalidInput, match="unknown precision"):
        roofline(t4, "fp12", 1e9, 0)
    with pytest.raises(InvalidInput):
        roofline(t4, "int8", 0, 0)
    with pytest.raises(InvalidInput):
        roofline(t4, "int8", 1e9, -1)


def test_every_catalog_device_gives_a_roofline_where_it_publishes_a_peak() -> None:
    for spec in load_catalog():
        for precision in spec.dense:
            line = roofline(spec, precision, RESNET50_FLOPS, 25e6)
            assert 0 < line.attainable_rate < math.inf


# -- the batch: weights read once per batch, activations and I/O once per sample -----------------


def test_weights_are_shared_by_the_batch() -> None:
    traffic = Traffic(weight_bytes=25e6, sample_bytes=5e6)
    assert traffic.per_sample(1) == 30e6 and traffic.per_sample(25) == 6e6
    with pytest.raises(InvalidInput, match="at least 1"):
        traffic.per_sample(0)
    h100 = load_catalog().get("H100-SXM")
    one = batch_roofline(h100, "int8", RESNET50_FLOPS, traffic, 1)
    many = batch_roofline(h100, "int8", RESNET50_FLOPS, traffic, 64)
    assert one.batch == 1 and many.batch == 64
    assert many.memory_bound_rate > one.memory_bound_rate
    assert many.compute_bound_rate == one.compute_bound_rate


def test_the_best_batch_is_the_first_compute_bound_one() -> None:
    h100 = load_catalog().get("H100-SXM")
    traffic = Traffic(weight_bytes=25e6, sample_bytes=5e6)  # bandwidth / 5 MB > compute ceiling
    at_best = best_roofline(h100, "int8", RESNET50_FLOPS, traffic)
    best = at_best.batch
    below = batch_roofline(h100, "int8", RESNET50_FLOPS, traffic, best - 1)
    assert at_best.bound == "compute" and below.bound == "memory"
    bigger = batch_roofline(h100, "int8", RESNET50_FLOPS, traffic, 10 * best)
    assert bigger.attainable_rate == at_best.attainable_rate


def test_when_no_batch_is_compute_bound_the_best_nears_the_memory_limit() -> None:
    l4 = load_catalog().get("L4")
    traffic = Traffic(weight_bytes=25e6, sample_bytes=60e6)
    limit = l4.memory_bandwidth / 60e6  # type: ignore[operator]
    at_best = best_roofline(l4, "int8", RESNET50_FLOPS, traffic)
    below = batch_roofline(l4, "int8", RESNET50_FLOPS, traffic, at_best.batch - 1)
    assert at_best.bound == "memory"
    assert 0.99 * limit <= at_best.attainable_rate < limit
    assert below.attainable_rate < 0.99 * limit


def test_without_weights_or_bandwidth_the_batch_changes_nothing() -> None:
    h100 = load_catalog().get("H100-SXM")
    assert best_roofline(h100, "int8", RESNET50_FLOPS, Traffic(0.0, 5e6)).batch == 1
    cpu = load_catalog().get("CPU")
    assert best_roofline(cpu, "fp32", RESNET50_FLOPS, Traffic(25e6, 5e6)).batch == 1
