"""A fleet's connection rules from the user's flags, without starting one: the router gets the
per-client cap, the replicas none, and HAProxy accepts the configuration made of them."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from dlscale.cli import parse
from dlscale.scale import finish
from dlscale.scale.connections import CHECK_ROOM, ConnectionRules, behind_router
from dlscale.scale.devices import Device
from dlscale.scale.haproxy_config import Control, render, routes_map, write_errors
from dlscale.scale.local_fleet import worker_settings
from dlscale.server import settings_from

FLAGS = ["--max-connections-per-peer", "8", "--max-connections", "100"]


def test_a_device_fleet_caps_clients_at_its_router_and_not_at_its_workers(tmp_path: Path) -> None:
    user = settings_from(parse(["serve", str(tmp_path), "--device-workers", "2", *FLAGS]))
    rules = ConnectionRules.of(user)
    assert (rules.per_client, rules.replica_connections) == (8, 100)
    assert rules.per_replica == 100 - CHECK_ROOM  # the rest is the checks' own
    worker = worker_settings(user, Device("cpu0", None)).limits
    assert (worker.max_connections_per_peer, worker.max_connections) == (0, 100)


def test_a_ray_fleet_caps_clients_at_its_router_and_not_at_its_replicas(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray fleet's settings need the [ray] extra")
    from dlscale.scale.commands import settings_from as ray_settings

    scale = ray_settings(parse(["serve", str(tmp_path), "--ray", *FLAGS]))
    assert ConnectionRules.of(scale.server).per_client == 8  # the router actor's (deploy.py)
    assert scale.server is not None
    assert behind_router(scale.server).limits.max_connections_per_peer == 0  # fleet.py's child


def test_a_small_replica_keeps_half_its_connections_for_checks() -> None:
    assert ConnectionRules(replica_connections=10).per_replica == 5
    assert ConnectionRules(replica_connections=1).per_replica == 1


def _config(tmp_path: Path, rules: ConnectionRules, ipv6: bool) -> str:
    write_errors(tmp_path)
    routes_map(tmp_path).write_text("")
    finish.write(tmp_path)
    socks = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        socks.append(sock)
    fds = {"rest": socks[0].fileno(), "grpc": socks[1].fileno()}
    text = render(fds, tmp_path, Control("127.0.0.1", 1, 2), rules=rules, ipv6=ipv6)
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    check = [shutil.which("haproxy") or "haproxy", "-c", "-f", str(path)]
    done = subprocess.run(check, pass_fds=list(fds.values()), capture_output=True, check=False)
    for sock in socks:
        sock.close()
    assert done.returncode == 0, done.stderr.decode()
    return text


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
@pytest.mark.parametrize("ipv6", [False, True])
def test_haproxy_accepts_the_rules(tmp_path: Path, ipv6: bool) -> None:
    text = _config(tmp_path, ConnectionRules(per_client=8), ipv6)
    table = "ipv6" if ipv6 else "ip"
    assert text.count(f"stick-table type {table} ") == 2  # one per frontend: per protocol
    assert "tcp-request connection reject if { sc0_conn_cur gt 8 }" in text  # gRPC
    assert "http-request deny status 503" in text  # REST
    # rest, grpc, and the hashed backend of each
    assert text.count(f"maxconn {ConnectionRules().per_replica}") == 4


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
def test_no_cap_counts_nobody(tmp_path: Path) -> None:
    text = _config(tmp_path, ConnectionRules(per_client=0), False)
    assert "stick-table" not in text and "sc0_conn_cur" not in text
