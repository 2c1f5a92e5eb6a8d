"""The one naming rule of the server's shared-memory objects, and the one record of them."""

from __future__ import annotations

import os

import pytest

from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.wire import segments


def test_names_carry_the_reserved_prefix_the_owner_and_a_token() -> None:
    prefix = segments.scope_prefix("py1w")
    assert prefix == f"{segments.RESERVED_PREFIX}{os.getpid()}.py1w."
    first, second = segments.new_name(prefix), segments.new_name(prefix)
    assert first.startswith(prefix) and first != second
    assert len(first.removeprefix(prefix)) == 24  # 96 random bits: no one guesses it


def test_sweep_removes_only_the_servers_own_objects() -> None:
    prefix = segments.scope_prefix("test-sweep")
    for _ in range(2):
        (segments.SHM_DIR / segments.new_name(prefix)).touch()
    assert segments.sweep(prefix) == 2
    assert not list(segments.SHM_DIR.glob(f"{prefix}*"))
    with pytest.raises(ValueError, match="only removes the server's own objects"):
        segments.sweep("tensors-of-a-client")


def test_the_registry_and_the_transports_share_one_record() -> None:
    identity = (-1, -1)  # no real object has it
    registry = SharedMemoryRegistry(enabled=True)
    registry.reserve(identity)
    assert identity in segments.OWN
    registry.unreserve(identity)
    assert identity not in segments.OWN
