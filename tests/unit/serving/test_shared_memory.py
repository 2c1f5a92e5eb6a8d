"""The shared-memory registry on real POSIX shared-memory objects: bounds, leases, release."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from dlscale.errors import InvalidInput, NotFound, Unsupported
from dlscale.serving.regions.registry import Lease, RegionKind, SharedMemoryRegistry
from dlscale.serving.regions.system import SHM_DIR, shm_path
from dlscale.types import Datatype, RegionRef, RegionTensor

_counter = itertools.count()
Make = Callable[[bytes], str]


@pytest.fixture
def make_object() -> Iterator[Make]:
    """Creates /dev/shm objects holding the given bytes; returns their keys."""
    keys: list[str] = []

    def make(content: bytes) -> str:
        key = f"/dlscale-unit-{os.getpid()}-{next(_counter)}"
        shm_path(key).write_bytes(content)
        keys.append(key)
        return key

    yield make
    for key in keys:
        shm_path(key).unlink(missing_ok=True)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry(enabled=True, max_regions=2)
    yield reg
    reg.close()


def _tensor(region: str, offset: int = 0) -> RegionTensor:
    return RegionTensor(Datatype.FP32, (2, 2), RegionRef(region, 16, offset))


def test_an_input_is_a_private_copy_of_the_region(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    values = np.arange(8, dtype=np.float32)
    key = make_object(values.tobytes())
    registry.register_system("r", key, offset=8, byte_size=24)  # values[2:8]
    lease = Lease(registry)
    array = lease.input("x", _tensor("r", offset=4), None)
    np.testing.assert_array_equal(array, values[3:7].reshape(2, 2))
    # A copy taken at use (pread), never a view of a mapping: a client that truncates or
    # rewrites its object afterwards cannot reach the server's memory (SIGBUS).
    with shm_path(key).open("r+b") as file:
        file.write(np.full(8, 5, np.float32).tobytes())
    assert float(array[0, 0]) == 3.0
    del array
    lease.release()


def test_every_place_is_checked_against_the_region(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    registry.register_system("r", make_object(bytes(32)), 0, 32)
    lease = Lease(registry)
    with pytest.raises(InvalidInput, match="exceed the 32 bytes of region 'r'"):
        lease.input("x", _tensor("r", offset=20), None)
    with pytest.raises(InvalidInput, match="is not registered"):
        lease.input("x", _tensor("nowhere"), None)
    with pytest.raises(InvalidInput, match="takes 16 bytes, but its shared_memory_byte_size"):
        lease.input("x", RegionTensor(Datatype.FP32, (2, 2), RegionRef("r", 12)), None)
    with pytest.raises(InvalidInput, match="exceed the 32 bytes"):
        lease.check_output("y", RegionRef("r", 33))
    lease.release()
    assert registry.users("r") == 0


def test_registration_checks_object_name_and_bound(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object(bytes(64))
    with pytest.raises(InvalidInput, match="exceed the 64 bytes"):
        registry.register_system("r", key, 32, 64)
    with pytest.raises(InvalidInput, match="no shared-memory object"):
        registry.register_system("r", "/dlscale-unit-missing", 0, 8)
    for bad in ("../x", "/a/b", "", "/.."):
        with pytest.raises(InvalidInput, match="shared-memory key"):
            registry.register_system("r", bad, 0, 8)
    with pytest.raises(InvalidInput, match="region name"):
        registry.register_system("a b", key, 0, 8)
    registry.register_system("a", key, 0, 8)
    registry.register_system("b", key, 8, 8)
    with pytest.raises(InvalidInput, match="maximum of 2"):
        registry.register_system("c", key, 16, 8)
    with pytest.raises(NotFound):
        registry.status(RegionKind.SYSTEM, "c")
    with pytest.raises(NotFound, match="registered as system shared memory, not cuda"):
        registry.status(RegionKind.CUDA, "a")


def test_a_symlink_is_not_a_shared_memory_object(registry: SharedMemoryRegistry) -> None:
    link = SHM_DIR / f"dlscale-unit-link-{os.getpid()}"
    link.symlink_to("/etc/hostname")
    try:
        with pytest.raises(InvalidInput, match="cannot be opened"):
            registry.register_system("r", f"/{link.name}", 0, 4)
    finally:
        link.unlink()


def test_unregistering_a_region_in_use_waits_for_its_leases(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    registry.register_system("r", make_object(bytes(16)), 0, 16)
    lease = Lease(registry)
    array = lease.input("x", _tensor("r"), None)
    release_for_batcher = lease.hold()  # the batcher's share of the lease
    registry.unregister(RegionKind.SYSTEM, "r")
    assert [s.name for s in registry.status(RegionKind.SYSTEM)] == ["r"]
    with pytest.raises(InvalidInput, match="is being unregistered"):
        Lease(registry).input("x", _tensor("r"), None)
    lease.release()  # the DataPlane is done; the batcher still reads the inputs
    assert registry.users("r") == 1
    assert float(array.sum()) == 0.0  # still mapped
    del array
    release_for_batcher()
    assert registry.status(RegionKind.SYSTEM) == []


def test_a_view_kept_past_release_delays_the_unmapping_only(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    registry.register_system("r", make_object(bytes(16)), 0, 16)
    lease = Lease(registry)
    kept = lease.input("x", _tensor("r"), None)
    lease.release()
    registry.unregister(RegionKind.SYSTEM, "r")
    assert registry.status(RegionKind.SYSTEM) == []
    assert float(kept.sum()) == 0.0  # the mapping outlives its name while a view holds it
    del kept
    registry.close()


def test_outputs_are_written_into_the_region(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object(bytes(64))
    registry.register_system("out", key, 0, 64)
    lease = Lease(registry)
    lease.check_output("y", RegionRef("out", 32, 16))
    y = np.arange(6, dtype=np.int32).reshape(2, 3)
    placed = lease.write("y", y, RegionRef("out", 32, 16))
    assert placed == RegionTensor(Datatype.INT32, (2, 3), RegionRef("out", 24, 16))
    with pytest.raises(InvalidInput, match="takes 24 bytes, more than"):
        lease.write("y", y, RegionRef("out", 8, 16))
    lease.release()
    stored = np.frombuffer(shm_path(key).read_bytes(), np.int32, 6, 16)
    np.testing.assert_array_equal(stored, y.ravel())


def test_off_unless_enabled(make_object: Make) -> None:
    registry = SharedMemoryRegistry()
    with pytest.raises(Unsupported, match="--allow-client-shm"):
        registry.register_system("r", make_object(bytes(8)), 0, 8)
    with pytest.raises(Unsupported):
        Lease(registry).input("x", _tensor("r"), None)
    assert registry.status(RegionKind.SYSTEM) == []


def test_close_releases_every_region(make_object: Make) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("a", make_object(bytes(8)), 0, 8)
    registry.register_system("b", make_object(bytes(8)), 0, 8)
    registry.close()
    assert registry.status(RegionKind.SYSTEM) == []
