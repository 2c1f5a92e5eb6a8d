"""Finish-first routing's parts that need no HAProxy: each replica's batch clock from recorded
readings, the map's runtime commands, and the rule's place in HAProxy's configuration."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dlscale.scale import finish
from dlscale.scale.haproxy_config import render
from dlscale.scale.weights import Weigher, Work


def _read(weigher: Weigher, fast: Work, slow: Work) -> dict[str, int]:
    weigher.weights({"fast": Work(0, 0, 1, at=10.0), "slow": Work(0, 0, 1, at=10.0)})
    return weigher.weights({"fast": fast, "slow": slow})


def test_a_replicas_clock_is_its_time_per_batch_with_the_fleets_largest_batch() -> None:
    """Recorded from the routing benchmark's pair: the fast replica ran batches of up to 4 and
    the slow one, sent a request only when idle, batches of 1; each request counts the compute
    time of its batch (50.6 and 150.9 ms)."""
    weigher = Weigher()
    _read(
        weigher,
        Work(560, 560 * 50_600_000, 4, at=12.0),
        Work(24, 24 * 150_900_000, 1, at=12.0),
    )
    assert weigher.clocks() == {
        "fast": pytest.approx((0.0506, 4)),
        "slow": pytest.approx((0.1509, 4)),
    }


def test_a_replica_with_too_few_rows_has_no_clock_yet() -> None:
    weigher = Weigher()
    _read(weigher, Work(100, 100 * 50_000_000, 4, at=12.0), Work(3, 3 * 150_000_000, 1, at=12.0))
    assert set(weigher.clocks()) == {"fast"}


def test_the_map_is_added_to_set_and_emptied_one_server_at_a_time() -> None:
    path = Path("/w/clocks.map")
    held = {"r1": "0.050000:4", "r2": "-"}
    wanted: dict[str, str | None] = {
        "r1": "0.050000:4",  # unchanged: no command
        "r2": "0.150000:4",  # measured now
        "r3": "-",  # a new member
        "r4": None,  # gone, and never held: no command
    }
    assert finish.map_commands(path, held, wanted) == [
        f"set map {path} r2 0.150000:4",
        f"add map {path} r3 -",
    ]
    assert finish.map_commands(path, held, {"r1": None}) == [f"del map {path} r1"]


def test_a_clock_is_seconds_and_rows_never_below_one_row() -> None:
    assert finish.clock(0.0506, 4) == "0.050600:4"
    assert finish.clock(0.15, 0) == "0.150000:1"


def test_the_rule_places_requests_of_the_weighed_backends_only(tmp_path: Path) -> None:
    """REST and gRPC requests go where they finish first; the hashed backends (prefix and
    session routing) keep their consistent hash."""
    rest, grpc = socket.socket(), socket.socket()
    with rest, grpc:
        config = render({"rest": rest.fileno(), "grpc": grpc.fileno()}, tmp_path)
    assert f"lua-load {finish.lua_path(tmp_path)}" in config
    backends = {b.split("\n", 1)[0]: b for b in config.split("\nbackend ")[1:]}
    for name in ("rest", "grpc"):
        assert "http-request lua.dlscale_pick" in backends[name]
        assert "use-server %[var(txn.dlscale_server)]" in backends[name]
    for name in ("rest_hashed", "grpc_hashed"):
        assert "lua.dlscale" not in backends[name]


def test_the_rule_is_written_with_its_maps_path(tmp_path: Path) -> None:
    finish.write(tmp_path)
    first = finish.lua_path(tmp_path).read_text().splitlines()[0]
    assert first == f'local FINISH_MAP = "{finish.map_path(tmp_path)}"'
    assert finish.map_path(tmp_path).read_text() == ""
