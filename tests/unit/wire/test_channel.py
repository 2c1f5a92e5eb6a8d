"""The one transport between the server's processes, as the REST workers use it: large
buffers in shared-memory segments, the rest in band."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

from dlscale.frontends.rest.body import POOLED_FROM, BodyBuffers
from dlscale.serving.regions.system import SHM_DIR, SystemRegion
from dlscale.types import InferenceRequest
from dlscale.wire import channel
from dlscale.wire.segments import Segments, scope_prefix, sweep


@pytest.fixture
def segments() -> Iterator[Segments]:
    made = Segments(scope_prefix("test-ipc"))
    yield made
    made.close()
    sweep(made.prefix)


def _owner_side(spot: channel.Descriptor) -> memoryview:
    key, offset, size = spot
    return SystemRegion(key, 0, (SHM_DIR / key).stat().st_size).view(offset, size)


def _round_trip(message: object, segments: Segments) -> tuple[object, list[bytes]]:
    frame = channel.encode(message, segments.locate)
    size, meta_size = channel.FRAME.unpack(frame[0])
    assert (len(frame[2]), len(frame[1])) == (size, meta_size)
    return channel.decode(frame[1], frame[2], _owner_side), frame


def test_a_tensor_in_a_segment_is_read_in_place(segments: Segments) -> None:
    body = segments.allocate(1 << 20)
    x = body[4096 : 4096 + 4 * 65536].view(np.float32).reshape(256, 256)
    x[:] = np.arange(65536, dtype=np.float32).reshape(256, 256)
    request = InferenceRequest("m", {"input": x}, parameters={"priority": 1})
    got, frame = _round_trip(request, segments)
    assert isinstance(got, InferenceRequest)
    assert len(frame[2]) < 4096  # the tensor's bytes were not pickled
    np.testing.assert_array_equal(got.inputs["input"], x)
    got.inputs["input"][0, 0] = -1  # the owner's view is the same memory
    assert x[0, 0] == -1
    assert got.priority == 1


def test_small_and_private_buffers_travel_in_band(segments: Segments) -> None:
    segments.allocate(1 << 20)
    small = np.arange(16, dtype=np.float32)
    private = np.ones(channel.OUT_OF_BAND_BYTES, np.uint8)  # large, but not in a segment
    got, frame = _round_trip({"small": small, "private": private}, segments)
    assert isinstance(got, dict)
    np.testing.assert_array_equal(got["small"], small)
    np.testing.assert_array_equal(got["private"], private)
    assert len(frame[2]) > channel.OUT_OF_BAND_BYTES


def test_a_dropped_segment_is_unlinked_and_reported(segments: Segments) -> None:
    body = segments.allocate(1 << 20)
    spot = segments.locate(body[10:20])
    assert spot is not None and spot[1:] == (10, 10)
    path = SHM_DIR / spot[0]
    assert path.exists()
    del body
    gc.collect()
    assert not path.exists()
    assert segments.dropped == [spot[0]]


def test_sweep_removes_what_a_prefix_names(segments: Segments) -> None:
    kept = segments.allocate(4096)
    assert sweep(segments.prefix) == 1
    assert not list(SHM_DIR.glob(f"{segments.prefix}*"))
    del kept


def test_body_pool_in_segments_trims_an_idle_buffer_behind_a_busy_one(
    segments: Segments,
) -> None:
    pool = BodyBuffers(allocate=segments.allocate)
    busy = pool.take(POOLED_FROM * 4)
    idle = pool.take(POOLED_FROM * 4)
    assert segments.locate(idle) is not None
    del idle
    pool.close()  # drops the idle one (the second in the pool), keeps the busy one
    assert pool.held_bytes == 1 << 20
    assert busy.size == POOLED_FROM * 4


def test_segment_names_hold_a_random_token(segments: Segments) -> None:
    # A name another process could guess is one it could register as a region, to read or
    # overwrite the bodies of other clients' requests: the names carry 96 random bits.
    first, second = segments.allocate(4096), segments.allocate(4096)
    keys = [segments.locate(a)[0] for a in (first, second) if segments.locate(a)]
    assert len(keys) == 2
    tokens = [key.removeprefix(segments.prefix) for key in keys]
    assert all(len(token) == 24 and int(token, 16) >= 0 for token in tokens)
    assert tokens[0] != tokens[1]
