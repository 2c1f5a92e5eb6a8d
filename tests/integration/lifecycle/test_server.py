"""The composition root: what ServerSettings ask for is what the started Server serves."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.server import settings_for

from dlscale.errors import NotFound
from dlscale.frontends.limits import Limits
from dlscale.server import ALL_MODELS, ServerSettings, ServerThread

ECHO = """max_batch_size = 4
[[inputs]]
name = "x"
datatype = "FP32"
shape = [2]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [2]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("server-repo")
    for name in ("first", "second"):
        write_null_model(root, name, ECHO)
    return root


def test_explicit_control_loads_the_named_models_and_the_ports_are_reported(repo: Path) -> None:
    settings = ServerSettings.build(
        repo,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        model_control="explicit",
        load_models=("second",),
        limits=Limits(keep_alive_s=3.0),
    )
    with ServerThread(settings) as running:
        server = running.server
        assert server.manager.ready_names() == ["second"]
        assert set(server.ports) == {"http", "grpc", "metrics"} and 0 not in server.ports.values()
        assert getattr(server.frontends["http"], "limits", None) == Limits(keep_alive_s=3.0)
        url = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b'nv_inference_count{model="second",version="1"}' in response.read()


def test_all_models_under_explicit_control_and_frontends_turned_off(repo: Path) -> None:
    settings = settings_for(repo, load_models=(ALL_MODELS,), http_port=None)
    with ServerThread(settings) as running:
        assert running.server.manager.ready_names() == ["first", "second"]
        assert set(running.server.ports) == {"grpc"}


def test_a_server_that_cannot_start_stops_its_thread(repo: Path) -> None:
    thread = ServerThread(settings_for(repo, load_models=("missing",), exit_on_error=True))
    with pytest.raises(NotFound, match="missing"):
        thread.start()
    assert thread.loop.is_closed()
