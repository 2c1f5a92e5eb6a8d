"""The rules that keep a client's region inside the client's bounds, each attack performed.

Real POSIX shared-memory objects under /dev/shm; each test fails if its rule is removed from
serving/regions/system.py (the reserved prefix, the server's own objects, one name only, the
owner, the checks before each use, pread/pwrite instead of a mapping).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from dlscale.errors import InvalidInput, PermissionDenied
from dlscale.serving.regions.registry import Lease, RegionKind, SharedMemoryRegistry
from dlscale.serving.regions.system import RESERVED_PREFIX, SystemRegion, shm_path
from dlscale.types import Datatype, RegionRef, RegionTensor

_counter = itertools.count()
Make = Callable[..., str]
NOBODY = 65534


@pytest.fixture
def make_object() -> Iterator[Make]:
    """Creates /dev/shm objects of `size` zero bytes; returns their keys."""
    paths: list[Path] = []

    def make(size: int = 16, name: str = "") -> str:
        key = f"/{name or f'dlscale-rules-{os.getpid()}-{next(_counter)}'}"
        path = shm_path(key)
        path.write_bytes(bytes(size))
        paths.append(path)
        return key

    yield make
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry(enabled=True, max_regions=4)
    yield reg
    reg.close()


def _input(registry: SharedMemoryRegistry, region: str = "r") -> np.ndarray:
    lease = Lease(registry)
    try:
        array = lease.input("x", RegionTensor(Datatype.FP32, (4,), RegionRef(region, 16)), None)
        return np.asarray(array)
    finally:
        lease.release()


def test_a_key_in_the_servers_namespace_is_refused(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object(name=f"{RESERVED_PREFIX}{os.getpid()}.0.1")
    with pytest.raises(PermissionDenied, match="server's own"):
        registry.register_system("r", key, 0, 16)
    assert registry.status(RegionKind.SYSTEM) == []


def test_the_servers_own_object_is_refused_under_any_name(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object()
    segment = SystemRegion(key, 0, 16)  # as frontends/workers/host.py maps a worker's segment
    registry.reserve(segment.identity)
    with pytest.raises(PermissionDenied, match="the server owns"):
        registry.register_system("r", key, 0, 16)
    registry.unreserve(segment.identity)
    registry.register_system("r", key, 0, 16)  # no longer the server's
    segment.close()


def test_an_object_with_a_second_name_is_refused(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object()
    alias = shm_path(key).with_name(shm_path(key).name + "-alias")
    os.link(shm_path(key), alias)
    try:
        with pytest.raises(PermissionDenied, match="several names"):
            registry.register_system("r", f"/{alias.name}", 0, 16)
    finally:
        alias.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's object needs root")
def test_another_users_private_object_is_refused(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object()
    path = shm_path(key)
    os.chown(path, NOBODY, NOBODY)
    path.chmod(0o600)
    # Root opens it all the same: the owner rule, not the file mode, is what refuses it.
    with pytest.raises(PermissionDenied, match=f"belongs to uid {NOBODY}"):
        registry.register_system("r", key, 0, 16)
    trusting = SharedMemoryRegistry(enabled=True, owners=frozenset({NOBODY}))  # --shm-owner-uid
    trusting.register_system("r", key, 0, 16)  # the owners a deployment names are taken
    trusting.close()


def test_a_truncated_object_fails_the_request_only(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object(16)
    registry.register_system("r", key, 0, 16)
    os.truncate(shm_path(key), 4)
    with pytest.raises(InvalidInput, match="shrank to 4 bytes"):
        _input(registry)
    lease = Lease(registry)
    lease.check_output("y", RegionRef("r", 16))
    with pytest.raises(InvalidInput, match="shrank"):
        lease.write("y", np.zeros(4, np.float32), RegionRef("r", 16))
    lease.release()
    os.truncate(shm_path(key), 16)  # grown back: the region serves again
    np.testing.assert_array_equal(_input(registry), np.zeros(4, np.float32))
    assert registry.users("r") == 0


def test_a_replaced_or_removed_object_fails_the_request(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    key = make_object(16)
    registry.register_system("r", key, 0, 16)
    path = shm_path(key)
    path.unlink()
    with pytest.raises(InvalidInput, match="was removed"):
        _input(registry)
    path.write_bytes(np.ones(4, np.float32).tobytes())  # the same name, another object
    with pytest.raises(InvalidInput, match="was replaced"):
        _input(registry)
    registry.unregister(RegionKind.SYSTEM, "r")
    registry.register_system("r", key, 0, 16)  # registered again: the new object is read
    np.testing.assert_array_equal(_input(registry), np.ones(4, np.float32))


def test_truncation_racing_the_reads_never_kills_the_process(
    registry: SharedMemoryRegistry, make_object: Make
) -> None:
    size = 4 << 20
    key = make_object(size)
    registry.register_system("r", key, 0, size)
    path = shm_path(key)
    stop = threading.Event()

    def shrink_and_grow() -> None:
        while not stop.is_set():
            os.truncate(path, 0)
            os.truncate(path, size)

    attacker = threading.Thread(target=shrink_and_grow)
    attacker.start()
    outcomes = set()
    try:
        for _ in range(200):
            lease = Lease(registry)
            try:
                ref = RegionRef("r", size)
                lease.input("x", RegionTensor(Datatype.UINT8, (size,), ref), None)
                outcomes.add("read")
            except InvalidInput:
                outcomes.add("refused")  # a mapping would have raised SIGBUS here instead
            finally:
                lease.release()
    finally:
        stop.set()
        attacker.join()
    assert outcomes <= {"read", "refused"}
