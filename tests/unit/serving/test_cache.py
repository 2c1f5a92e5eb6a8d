"""The response cache: exact-match keys, a byte bound with LRU eviction, frozen copies."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.serving.cache import ENTRY_OVERHEAD, ResponseCache, request_key


def _key(x: np.ndarray, model: str = "m", outputs: tuple[tuple[str, int], ...] = ()) -> bytes:
    return request_key(model, "1", {"x": x}, list(outputs))


def test_the_key_changes_with_anything_that_changes_the_answer() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = _key(x)
    assert _key(x.copy()) == base  # equal bytes, equal key
    assert _key(x.reshape(3, 2)) != base  # same bytes, another shape
    assert _key(x.astype(np.int32)) != base  # another datatype
    assert _key(x + 1) != base
    assert _key(x, model="other") != base
    assert _key(x, outputs=(("y", 0),)) != _key(x, outputs=(("y", 3),))  # classification
    assert request_key("m", "2", {"x": x}, []) != base
    words = np.array([b"ab", b"c"], dtype=object)
    assert request_key("m", "1", {"x": words}, []) != request_key(
        "m", "1", {"x": np.array([b"a", b"bc"], dtype=object)}, []
    )


def test_hits_return_frozen_copies_and_misses_none() -> None:
    cache = ResponseCache(1 << 20)
    y = np.ones((2, 3), np.float32)
    key = _key(y)
    assert cache.get(key) is None
    assert cache.put(key, {"y": y})
    y[:] = 7  # the batch buffer is reused: the held answer must not change
    held = cache.get(key)
    assert held is not None and float(held["y"].sum()) == 6.0
    with pytest.raises(ValueError):
        held["y"][0, 0] = 1  # read-only: no caller can change another's answer


def test_the_byte_bound_evicts_least_recently_used_first() -> None:
    row = np.zeros(100, np.uint8)
    cache = ResponseCache(3 * (100 + ENTRY_OVERHEAD))
    keys = [_key(np.array([i])) for i in range(4)]
    for key in keys[:3]:
        cache.put(key, {"y": row})
    cache.get(keys[0])  # now the most recent
    cache.put(keys[3], {"y": row})
    assert cache.get(keys[1]) is None  # the least recently used went
    kept = (keys[0], keys[2], keys[3])
    assert all(cache.get(key) is not None for key in kept)  # that one only: the bound is met
    # An answer larger than the whole cache is not kept, and evicts nothing.
    assert not cache.put(_key(np.array([9])), {"y": np.zeros(10_000, np.uint8)})
    assert cache.get(_key(np.array([9]))) is None
    assert all(cache.get(key) is not None for key in kept)


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError):
        ResponseCache(-1)
