"""What reading (and writing) a client's region with pread (pwrite) costs, against a mapping.

    python -m benchmarks.shm_read [--repeats 50] [--mb 19]

A region of 19 MB (32 images FP32 3x224x224, one `identity` request of benchmarks/shm.py) is
read three ways: a view of a mapping (no copy, the old path, which a client truncating its
object turns into SIGBUS), a copy out of the mapping (np.copy of the view: one pass over the
bytes, what a backend reading the view pays at least) and `ClientObject.read` (fstat checks,
then preadv into a fresh array: the path the server takes now); outputs likewise, a copy into
the mapping against `ClientObject.write` (pwrite). Medians printed in ms.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from dlscale.serving.regions.system import ClientObject, shm_path


def _median_ms(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _measure(key: str, size: int, repeats: int) -> dict[str, float]:
    client = ClientObject(key, 0, size, set(), frozenset({os.geteuid()}))
    with shm_path(key).open("r+b") as file:
        mapping = mmap.mmap(file.fileno(), size)
    view = np.frombuffer(mapping, np.uint8)
    source = np.ones(size, np.uint8)
    results = {
        "view of a mapping (no copy, SIGBUS-prone)": _median_ms(lambda: view[:size], repeats),
        "np.copy out of a mapping": _median_ms(lambda: np.copy(view), repeats),
        "ClientObject.read (fstat + preadv)": _median_ms(lambda: client.read(0, size), repeats),
        "copy into a mapping (the old output path)": _median_ms(
            lambda: np.copyto(view, source), repeats
        ),
        "ClientObject.write (fstat + pwrite)": _median_ms(
            lambda: client.write(0, source.data), repeats
        ),
    }
    client.close()
    return results


def main() -> None:
    """Measure the three reads and print their medians."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--mb", type=float, default=32 * 3 * 224 * 224 * 4 / 2**20)
    args = parser.parse_args()
    size = int(args.mb * 2**20)
    key = f"/dlscale-bench-read-{os.getpid()}"
    path = shm_path(key)
    path.write_bytes(np.random.default_rng(0).bytes(size))
    try:
        results = _measure(key, size, args.repeats)
    finally:
        path.unlink(missing_ok=True)
    print(f"{size / 2**20:.1f} MB, {args.repeats} repeats, medians:")
    for name, ms in results.items():
        rate = f"{size / 2**30 / (ms / 1e3):.1f} GiB/s" if ms > 0.01 else "no copy"
        print(f"  {name:45s} {ms:8.3f} ms  ({rate})")


if __name__ == "__main__":
    main()
