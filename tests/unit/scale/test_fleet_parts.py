"""The fleet's parts that need no cluster: the wanted models' log, the metrics page's merge, and
HAProxy's control rules (checked by `haproxy -c` itself where it is installed)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from dlscale.scale import finish
from dlscale.scale.child import Endpoint
from dlscale.scale.control import ControlLog
from dlscale.scale.haproxy import HaproxyRouter
from dlscale.scale.haproxy_config import Control, render, routes_map, write_errors
from dlscale.scale.metrics import merge
from dlscale.scale.prefix import write_map
from dlscale.scale.registry import Replica

LOAD, UNLOAD = "/v2/repository/models/{}/load", "/v2/repository/models/{}/unload"


def _record(log: ControlLog, model: str, path: str) -> None:
    log.record(model, "rest", path.format(model), b"{}", "application/json")


def test_the_log_keeps_each_models_latest_request_in_order() -> None:
    log = ControlLog()
    _record(log, "a", UNLOAD)
    _record(log, "b", LOAD)
    _record(log, "a", LOAD)
    assert [e.model for e in log.entries()] == ["b", "a"]
    assert log.wanted() == {"b": "load", "a": "load"}


def test_a_request_no_replica_took_is_forgotten_and_the_previous_one_kept() -> None:
    log = ControlLog()
    _record(log, "a", LOAD)
    entry, previous = log.record("a", "rest", UNLOAD.format("a"), b"", "application/json")
    log.forget(entry, previous)
    assert log.wanted() == {"a": "load"}


def test_a_restarted_router_adopts_only_a_newer_copy() -> None:
    replica, fresh = ControlLog(), ControlLog()
    _record(replica, "a", UNLOAD)
    assert fresh.adopt(replica.entries()) and fresh.wanted() == {"a": "unload"}
    assert not replica.adopt(ControlLog().entries())  # an empty copy changes nothing
    _record(fresh, "b", LOAD)
    assert fresh.seq == 2  # later requests number after the adopted ones


def _replica(key: str) -> Replica:
    return Replica(key, f"node-{key}", Endpoint("10.0.0.1", 1, 2, None, 3))


PAGE = """# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="m",version="1"} 4.0
# HELP up_seconds Uptime
# TYPE up_seconds gauge
up_seconds 9.0
"""


def test_one_page_keeps_the_names_and_labels_each_sample_by_replica() -> None:
    text = merge([(_replica("r1"), PAGE), (_replica("r2"), PAGE), (_replica("r3"), None)])
    assert text.count("# TYPE nv_inference_count counter") == 1  # not renamed to _total
    assert 'nv_inference_count{model="m",version="1",replica="r2",node="node-r2"} 4.0' in text
    assert 'up_seconds{replica="r1",node="node-r1"} 9.0' in text
    assert 'dlscale_fleet_scrape_ok{replica="r3",node="node-r3"} 0.0' in text
    # A family's samples stay together (Prometheus' text format requires it).
    lines = text.splitlines()
    counts = [i for i, line in enumerate(lines) if line.startswith("nv_inference_count{")]
    assert counts == list(range(counts[0], counts[0] + 2))


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
def test_haproxy_accepts_the_control_rules(tmp_path: Path) -> None:
    rest, grpc = socket.socket(), socket.socket()
    with rest, grpc:
        fds = {"rest": rest.fileno(), "grpc": grpc.fileno()}
        write_errors(tmp_path)
        write_map(routes_map(tmp_path), {})  # the models hashed by prefix (none)
        finish.write(tmp_path)  # the finish-first rule HAProxy loads
        config = render(fds, tmp_path, Control("127.0.0.1", 9000, 9001))
        (tmp_path / "h.cfg").write_text(config)
        check = subprocess.run(
            ["haproxy", "-c", "-f", str(tmp_path / "h.cfg")],
            pass_fds=tuple(fds.values()),
            capture_output=True,
            text=True,
            check=False,
        )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "use_backend control_rest if control" in config
    assert "use_backend control_grpc if control" in config


def test_a_router_under_a_deep_tmpdir_starts_with_its_socket_under_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HAProxy refuses a runtime socket path over 97 bytes; a deep TMPDIR (a CI runner's, a
    # test's) must not keep the router from starting.
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    router = HaproxyRouter("127.0.0.1", 0, None)
    try:
        router.start()
        assert router.workdir.parent == Path("/tmp")
        assert router.states() == {}  # the runtime socket answers
    finally:
        router.stop()
    assert not router.workdir.exists()
