"""Each system region holds a file descriptor: regions draw on the process's one descriptor
budget with the connections, so a client cannot take the descriptors others need."""

from __future__ import annotations

import os

import pytest

from dlscale.errors import DlscaleError, Unavailable
from dlscale.frontends.limits import DescriptorBudget
from dlscale.serving.regions.registry import RegionKind, SharedMemoryRegistry
from dlscale.serving.regions.system import shm_path


def test_regions_count_in_the_descriptor_budget() -> None:
    budget = DescriptorBudget(total=2)
    registry = SharedMemoryRegistry(enabled=True, max_regions=8, descriptors=budget)
    keys = [f"/dlscale-fds-{os.getpid()}-{i}" for i in range(3)]
    for key in keys:
        shm_path(key).write_bytes(bytes(16))
    try:
        registry.register_system("a", keys[0], 0, 16)
        registry.register_system("b", keys[1], 0, 16)
        assert budget.used == 2
        with pytest.raises(Unavailable, match="no file descriptor left"):
            registry.register_system("c", keys[2], 0, 16)
        assert budget.used == 2  # the refused one took nothing
        registry.unregister(RegionKind.SYSTEM, "a")
        assert budget.used == 1
        registry.register_system("c", keys[2], 0, 16)
        # A registration the object refuses gives its descriptor back.
        registry.unregister(RegionKind.SYSTEM, "b")
        with pytest.raises(DlscaleError) as caught:
            registry.register_system("d", "/dlscale-fds-missing", 0, 16)
        assert not isinstance(caught.value, Unavailable)
        assert budget.used == 1
    finally:
        registry.close()
        for key in keys:
            shm_path(key).unlink(missing_ok=True)
    assert budget.used == 0
