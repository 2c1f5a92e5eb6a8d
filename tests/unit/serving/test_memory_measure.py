"""What a load is measured with: the process's RSS, a model folder's files, NVML's device for a
CUDA index (NVML does not run here: a stand-in library answers its two calls)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlscale.hardware.nvml import Nvml
from dlscale.serving.memory import ledger, measure, versions

MiB = 2**20


def test_host_bytes_grow_with_what_the_process_holds() -> None:
    # In a fresh process: one that ran other tests may hold freed pages that a new array
    # reuses without growing (a CI worker read the same byte count before and after).
    code = (
        "import numpy as np; from dlscale.serving.memory import measure; "
        "before = measure.host_bytes(); held = np.ones(64 * 2**20, np.uint8); "
        "print(measure.host_bytes() - before); del held; measure.trim()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 48 * MiB  # written: resident, not only reserved


def test_host_bytes_count_child_processes() -> None:
    before = measure.host_bytes()
    child = _holding(64)
    try:
        assert measure.host_bytes() - before >= 48 * MiB
    finally:
        child.communicate("", timeout=30)


def _holding(mib: int) -> subprocess.Popen[str]:
    """A child process holding `mib` MiB written, once it says so; it ends when its input does."""
    hold = f"import sys; x = bytearray({mib} * 2**20); print('held', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


def test_a_reading_counts_the_processes_started_since_not_those_that_ran_before() -> None:
    # A process that ran before the reading (a REST worker, another model's worker, a test's
    # Ray cluster) ends while a load starts one of its own: the growth read is the new one's.
    old = _holding(64)
    try:
        before, running = measure.trim_and_read(False, ["cpu"])
        assert old.pid in running
        new = _holding(64)
        old.communicate("", timeout=30)
        try:
            after = measure.read(["cpu"], running)
            assert after["cpu"] - before["cpu"] >= 48 * MiB, (before, after)
        finally:
            new.communicate("", timeout=30)
    finally:
        if old.returncode is None:
            old.communicate("", timeout=30)


def test_a_folder_counts_its_files(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"x" * 1000)
    with open(tmp_path / "1" / "weights.bin", "wb") as sparse:
        sparse.truncate(5 * MiB)
    assert measure.folder_bytes(tmp_path) == 1000 + 5 * MiB
    assert measure.read(["cpu", "tpu"]).keys() == {"cpu"}


class _Lib:
    """The two NVML calls a device's handle comes from."""

    NVMLError = RuntimeError

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return f"index {index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        return f"uuid {uuid}"


@pytest.mark.parametrize(
    ("visible", "index", "handle"),
    [
        ("", 1, "index 1"),
        ("2,3", 1, "index 3"),
        ("GPU-abc", 0, "uuid GPU-abc"),
        ("2", 1, None),
    ],
)
def test_a_cuda_index_is_the_visible_devices_one(
    monkeypatch: pytest.MonkeyPatch, visible: str, index: int, handle: str | None
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert measure._handle(Nvml(_Lib()), index) == handle


@pytest.mark.parametrize(
    ("grown", "known", "expected"),
    [
        (30, {}, 30),  # measured: the growth
        (2, {}, 10),  # less than the files (an allocator reusing freed memory): the files
        # Over memory handed back, no more than the files: the first load's figure was its
        # set-up (another thread's frees beside this load can even read a fall: ci21 kept
        # the first figure for a second copy asked at once, and refused it beside the first).
        (2, {"cpu": 25}, 10),
        (-5, {"cpu": 25}, 10),
        (20, {"cpu": 33}, 20),  # a smaller real growth replaces the first load's set-up
        (40, {"cpu": 33}, 33),  # a larger one is noise beside the earlier figure
    ],
)
def test_a_loads_figure_is_its_growth_corrected(
    grown: int, known: dict[str, int], expected: int
) -> None:
    floor = {"cpu": 10}
    size = versions.growth(["cpu", "gpu0"], {"cpu": 100}, {"cpu": 100 + grown}, floor, known)
    assert size == {"cpu": expected, "gpu0": 0}  # gpu0 unreadable and no files there


@pytest.mark.parametrize(
    ("grown", "known", "expected"),
    [
        (2, {"cpu": 25}, 25),  # the load reused freed memory: the earlier figure
        (20, {"cpu": 33}, 33),  # a smaller growth over freed memory does not lower it
        (40, {"cpu": 33}, 33),
        (30, {}, 30),  # nothing known: the growth (a first load trims first, `_trim_due`)
    ],
)
def test_a_growth_over_memory_not_handed_back_never_lowers_the_known_size(
    grown: int, known: dict[str, int], expected: int
) -> None:
    floor = {"cpu": 10}
    size = versions.growth(["cpu"], {"cpu": 100}, {"cpu": 100 + grown}, floor, known, {"cpu"})
    assert size == {"cpu": expected}


@pytest.mark.parametrize(
    ("budget", "untrimmed", "known", "due"),
    [
        ({"cpu": 1000 * MiB}, 0, {}, False),  # nothing freed: nothing to hand back
        ({"cpu": 1000 * MiB}, 10 * MiB, {"cpu": 5}, False),  # a known size: freed memory waits
        ({"cpu": 1000 * MiB}, 250 * MiB, {"cpu": 5}, True),  # a quarter of the budget gathered
        ({"cpu": 1000 * MiB}, 1, {}, True),  # a first measurement: its growth must not hide
        # A small budget: never less than the fixed amount (a quarter of 100 MiB trimmed every
        # few loads, and the next loads faulted the pages back in).
        ({"cpu": 100 * MiB}, 25 * MiB, {"cpu": 5}, False),
        ({"cpu": 100 * MiB}, ledger.TRIM_BYTES, {"cpu": 5}, True),
        ({}, ledger.TRIM_BYTES - 1, {"cpu": 5}, False),  # no host budget: a fixed amount
        ({}, ledger.TRIM_BYTES, {"cpu": 5}, True),
    ],
)
def test_freed_memory_goes_back_to_the_system_in_batches(
    budget: dict[str, int], untrimmed: int, known: dict[str, int], due: bool
) -> None:
    memory = ledger.MemoryLedger(budget)
    memory._untrimmed = untrimmed
    assert memory._trim_due(known) is due


def test_an_unloads_freed_memory_is_handed_back_before_a_first_measurement() -> None:
    """Any version freed, evicted or unloaded through the API, leaves its bytes with the
    allocator: the next first reading trims first, or a reload of its file reusing those pages
    would read as no growth (now taken as the files alone, `growth`)."""
    memory = ledger.MemoryLedger({"cpu": 100 * MiB})
    memory._held[7] = ("a", {"cpu": 5 * MiB})
    memory._names["a"] += 1
    assert not memory._trim_due({})
    memory.release(7)
    assert memory._trim_due({})  # a file never measured: trimmed before its reading
    assert not memory._trim_due({"cpu": 5 * MiB})  # a known size: freed memory waits
