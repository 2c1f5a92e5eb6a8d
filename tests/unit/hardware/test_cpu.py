"""The CPU entry: flags read from /proc/cpuinfo text, peaks from the documented formula."""

from __future__ import annotations

import dataclasses

import pytest

from dlscale.hardware.cpu import CpuInfo, cpu_spec, read_cpu
from dlscale.hardware.spec import DeviceSpec

SKYLAKE = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model name	: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
cpu MHz		: 1000.000
flags		: fpu sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl

processor	: 1
vendor_id	: GenuineIntel
"""
SAPPHIRE_RAPIDS = """vendor_id	: GenuineIntel
cpu family	: 6
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: sse2 avx2 fma avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8
"""
HASWELL = """vendor_id	: GenuineIntel
cpu family	: 6
model name	: Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz
flags		: sse2 avx fma avx2
"""
ZEN4 = """vendor_id	: AuthenticAMD
cpu family	: 25
model name	: AMD EPYC 9654
flags		: sse2 avx2 fma avx512f avx512_vnni avx512_bf16
"""


def _fixed(text: str, cores: int = 4, ghz: float = 2.0) -> CpuInfo:
    # The clock and core count come from the host through psutil; pin them for the formula.
    return dataclasses.replace(read_cpu(text), physical_cores=cores, ghz=ghz)


def _fp32(spec: DeviceSpec) -> float:
    peak = spec.peak_flops("fp32")
    assert peak is not None
    return peak


def test_avx512_fp32_peak_follows_the_formula() -> None:
    info = _fixed(SKYLAKE)
    assert (info.vector, info.fp32_lanes, info.fma_units) == ("avx512", 16, 2)
    spec = cpu_spec(info)
    # 4 cores x 2.0 GHz x 2 FMA units x 16 lanes x 2 FLOP
    assert spec.peak_flops("fp32") == pytest.approx(4 * 2.0e9 * 2 * 16 * 2)
    assert spec.peak_flops("fp64") == pytest.approx(_fp32(spec) / 2)
    assert spec.peak_flops("int8") is None  # no VNNI, no AMX
    assert "docs/hardware.md" in spec.source("fp32")


def test_avx2_has_half_the_lanes() -> None:
    info = _fixed(HASWELL)
    assert (info.vector, info.fp32_lanes) == ("avx2", 8)
    assert cpu_spec(info).peak_flops("fp32") == pytest.approx(4 * 2.0e9 * 2 * 8 * 2)


def test_amx_sets_bf16_and_int8() -> None:
    info = _fixed(SAPPHIRE_RAPIDS)
    assert info.amx
    spec = cpu_spec(info)
    assert spec.peak_flops("bf16") == pytest.approx(4 * 2.0e9 * 1024)
    assert spec.peak_flops("int8") == pytest.approx(4 * 2.0e9 * 2048)
    assert spec.peak_flops("fp16") == pytest.approx(2 * _fp32(spec))
    assert "AMX" in spec.source("int8")


def test_zen4_splits_avx512_over_256_bit_units() -> None:
    info = _fixed(ZEN4)
    assert info.fma_units == 1
    spec = cpu_spec(info)
    assert spec.peak_flops("int8") == pytest.approx(4 * _fp32(spec))


def test_model_name_and_this_host() -> None:
    assert read_cpu(SKYLAKE).model.startswith("Intel(R) Xeon(R) Gold 6148")
    host = read_cpu()
    assert host.physical_cores >= 1 and host.memory_bytes > 0
    spec = cpu_spec(host)
    assert spec.memory_bytes == host.memory_bytes
    if host.ghz:
        assert _fp32(spec) > 0
