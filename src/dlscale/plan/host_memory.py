"""The host's memory read bandwidth, measured: the CPU's catalog entry has none to give.

Decode reads every weight once per step, a stream far larger than the caches; this times the
same kind of stream: a BLAS dot product of an array with itself (one read of each element, on
the threads BLAS uses), the best of several runs, since other work on the host only slows it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from dlscale.hardware.spec import DeviceSpec

#: Eight times the largest L3 cache of a server CPU's slice a VM usually gets (32 MiB).
ARRAY_BYTES = 256 << 20
RUNS = 10


def read_bandwidth(nbytes: int = ARRAY_BYTES, runs: int = RUNS) -> float:
    """Bytes/s of the fastest of `runs` streaming reads of `nbytes`."""
    data = np.ones(nbytes // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        np.dot(data, data)
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def with_bandwidth(spec: DeviceSpec, bandwidth: float | None = None) -> DeviceSpec:
    """`spec` with a memory bandwidth: the one given, else measured here (for the CPU entry)."""
    if bandwidth is None:
        bandwidth = read_bandwidth()
        how = f"measured at run time: BLAS dot over {ARRAY_BYTES >> 20} MiB, best of {RUNS}"
    else:
        how = "given on the command line"
    return replace(spec, memory_bandwidth=bandwidth, sources={**spec.sources, "bandwidth": how})
