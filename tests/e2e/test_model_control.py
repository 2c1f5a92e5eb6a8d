"""`dlscale serve --model-control poll | explicit` as a user runs it: models follow the folder
or the API; a failed load or reload (a bad config, a failed warm-up) leaves what served serving.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tests.toolkit.cli import ServeProcess, served
from tests.toolkit.models import (
    fails_on_even_batches,
    identity_graph,
    write_model,
    write_null_model,
)
from tests.toolkit.repositories import NULL_TENSORS
from tritonclient.utils import InferenceServerException

ECHO = "max_batch_size = 8\n" + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
#: Warm-up runs batches of 1 and max_batch_size: an even max_batch_size fails it with this graph.
#: A warm-up at 8 rows, an even batch, which the model fails (the default warm-up is one row).
WARM_FAILS = 'max_batch_size = 8\n[[warmup]]\nname = "full"\nbatch_size = 8\n'


def _echo(client: httpclient.InferenceServerClient, model: str, version: str = "") -> np.ndarray:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = httpclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer(model, [tensor], model_version=version).as_numpy("y")
    np.testing.assert_array_equal(got, x)
    return got


def _index(client: httpclient.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in client.get_model_repository_index()}


def _versions(client: httpclient.InferenceServerClient, model: str) -> list[str]:
    return list(client.get_model_metadata(model)["versions"])


def _replace(path: Path, text: str) -> None:
    """Write a file in one step, as an editor or a deployment would, so a poll never reads half."""
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    os.replace(staged, path)


# -- poll ------------------------------------------------------------------------------------------


def test_poll_mode_follows_the_repository_folder(tmp_path: Path) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    write_null_model(repo, "a", ECHO)
    with served(repo, "--model-control", "poll", "--poll-interval", "0.2") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        _echo(client, "a")

        # A model folder that appears is loaded (moved in whole, as a deployment does).
        write_null_model(staging, "b", ECHO)
        os.rename(staging / "b", repo / "b")
        server.wait_until(lambda: client.is_model_ready("b"))
        _echo(client, "b")

        # A new version is loaded and served in place of the old (the default policy: latest).
        write_null_model(staging, "a", ECHO, versions=(2,))
        os.rename(staging / "a" / "2", repo / "a" / "2")
        server.wait_until(lambda: _versions(client, "a") == ["2"])
        _echo(client, "a", "2")

        # A config broken on disk fails the reload: version 2 keeps serving, and the log says so.
        _replace(repo / "a" / "config.toml", 'backend = "null"\nmax_batch_size = -3\n')
        server.wait_for("model a: reload failed, keeping the loaded versions")
        assert client.is_model_ready("a") and _versions(client, "a") == ["2"]
        _echo(client, "a")

        # A folder that disappears is unloaded; the others go on.
        shutil.rmtree(repo / "b")
        server.wait_until(lambda: not client.is_model_ready("b"))
        assert "b" not in _index(client)
        _echo(client, "a")


# -- explicit --------------------------------------------------------------------------------------


@pytest.fixture
def explicit_repo(tmp_path: Path) -> Path:
    """a and b (echo null models); m (an ONNX echo, version 1); warm_fails (fails its warm-up)."""
    write_null_model(tmp_path, "a", ECHO)
    write_null_model(tmp_path, "b", ECHO)
    write_model(tmp_path, "m", identity_graph(4, "x", "y"), WARM_FAILS)
    write_model(tmp_path, "warm_fails", fails_on_even_batches(), WARM_FAILS)
    return tmp_path


def _load_fails(client: httpclient.InferenceServerClient, model: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(model)
    assert caught.value.status() == "400"
    return str(caught.value.message())


def test_explicit_mode_loads_what_it_is_asked_for(explicit_repo: Path) -> None:
    with served(explicit_repo, "--model-control", "explicit", "--load-model", "a") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        index = _index(client)
        assert index["a"]["state"] == "READY"
        for name in ("b", "m", "warm_fails"):
            assert (index[name]["state"], index[name]["reason"]) == ("UNAVAILABLE", "not loaded")
            assert not client.is_model_ready(name)

        client.load_model("b")
        _echo(client, "b")
        client.unload_model("a")
        assert not client.is_model_ready("a")
        assert (_index(client)["a"]["state"], _index(client)["a"]["reason"]) == (
            "UNAVAILABLE",
            "unloaded",
        )
        _echo(client, "b")  # the other model is untouched


def test_a_model_failing_its_warm_up_is_unavailable_and_says_why(explicit_repo: Path) -> None:
    with served(explicit_repo, "--model-control", "explicit", "--load-model", "a") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        message = _load_fails(client, "warm_fails")
        assert "model 'warm_fails' failed its warm-up (full, batch size 8)" in message
        row = _index(client)["warm_fails"]
        assert (
            row["state"] == "UNAVAILABLE"
            and "failed its warm-up (full, batch size 8)" in row["reason"]
        )
        _echo(client, "a")


def test_a_failed_reload_keeps_the_old_version_serving(explicit_repo: Path) -> None:
    with served(explicit_repo, "--model-control", "explicit", "--load-model", "m") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _versions(client, "m") == ["1"]

        # A version 2 whose warm-up fails: the reload fails, version 1 goes on serving.
        write_model(explicit_repo, "m", fails_on_even_batches(), WARM_FAILS, version=2)
        assert "failed its warm-up (full, batch size 8)" in _load_fails(client, "m")
        _reload_failed(server, client)

        # A config broken since: the same.
        _replace(explicit_repo / "m" / "config.toml", "max_batch_size = -3\n")
        assert "max_batch_size" in _load_fails(client, "m")
        _reload_failed(server, client)


def _reload_failed(server: ServeProcess, client: httpclient.InferenceServerClient) -> None:
    server.wait_for("model m: reload failed, keeping the loaded versions")
    assert client.is_model_ready("m") and _versions(client, "m") == ["1"]
    assert _index(client)["m"]["state"] == "READY"
    _echo(client, "m")
