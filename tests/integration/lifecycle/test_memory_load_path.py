"""Issue 36: loads that do not redo work still see the repository as it is on disk.

A model's config is parsed once per content of its file and the repository's listing read
again only when its folder changes (models/remembered.py). Each test edits, adds or deletes
files under a real server loading on demand (tritonclient over REST, 127.0.0.1 port 0) and
checks that the next load or request sees the change: an edit of the same size (which a cache
keyed on sizes and whole-second times would miss), a deleted folder, a folder added.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException


def toml(width: int, version: int) -> str:
    """A null model y = x over `width` floats serving only `version` (no warm-up)."""
    return (
        f"max_batch_size = 4\nwarmup = []\nversion_policy = {{ specific = [{version}] }}\n"
        f'[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [{width}]\n'
        f'[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [{width}]\n'
    )


def pbtxt(name: str, width: int, version: int) -> str:
    """Triton's config.pbtxt of the same null model."""
    return (
        f'name: "{name}"\nbackend: "null"\nmax_batch_size: 4\n'
        f"version_policy: {{ specific: {{ versions: [{version}] }} }}\n"
        f'input [{{ name: "x" data_type: TYPE_FP32 dims: [{width}] }}]\n'
        f'output [{{ name: "y" data_type: TYPE_FP32 dims: [{width}] }}]\n'
    )


#: A Python model whose config.pbtxt names only its backend: its model.py completes it.
AUTO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [WIDTH]})
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [WIDTH]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
            )
            for r in requests
        ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_null_model(root, "resident", toml(2, 1))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, model_control="on-demand", load_models=()) as server:
        yield server


@pytest.fixture
def client(server: LocalServer) -> Iterator[triton.InferenceServerClient]:
    made = triton.InferenceServerClient(server.http_url, network_timeout=60)
    yield made
    made.close()


def ask(client: triton.InferenceServerClient, model: str, width: int) -> Any:
    x = triton.InferInput("x", [1, width], "FP32")
    x.set_data_from_numpy(np.arange(width, dtype=np.float32)[None])
    return client.infer(model, [x]).as_numpy("y")


def served(client: triton.InferenceServerClient, model: str) -> tuple[list[str], list[int]]:
    """The versions served and the input's shape, from the model's metadata."""
    meta = client.get_model_metadata(model)
    return meta["versions"], meta["inputs"][0]["shape"]


def test_an_edited_config_toml_is_seen_at_the_next_load(
    repo: Path, client: triton.InferenceServerClient
) -> None:
    folder = write_null_model(repo, "edited", toml(2, 1), versions=(1, 2))
    for width, version in ((2, 1), (3, 2), (2, 1), (3, 2)):
        # The same number of bytes each time: only the content tells the edits apart.
        (folder / "config.toml").write_text('backend = "null"\n' + toml(width, version))
        assert ask(client, "edited", width).tolist() == [list(range(width))]
        assert served(client, "edited") == ([str(version)], [-1, width])
        client.unload_model("edited")


def test_an_edited_config_pbtxt_is_seen_at_the_next_load(
    repo: Path, client: triton.InferenceServerClient
) -> None:
    folder = repo / "triton"
    for version in (1, 2):
        (folder / str(version)).mkdir(parents=True)
        (folder / str(version) / "model.null").touch()
    for width, version in ((2, 1), (3, 2), (2, 1)):
        (folder / "config.pbtxt").write_text(pbtxt("triton", width, version))
        assert ask(client, "triton", width).tolist() == [list(range(width))]
        assert served(client, "triton") == ([str(version)], [-1, width])
        client.unload_model("triton")


def test_a_config_pbtxt_completed_by_model_py_sees_an_edit_of_model_py(
    repo: Path, client: triton.InferenceServerClient
) -> None:
    folder = repo / "completed"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('backend: "python"\n')
    for width in (2, 3):  # the config.pbtxt stays as it is: model.py changes the shape
        (folder / "1" / "model.py").write_text(AUTO.replace("WIDTH", str(width)))
        assert ask(client, "completed", width).tolist() == [list(range(width))]
        assert served(client, "completed") == (["1"], [-1, width])
        client.unload_model("completed")


def test_a_deleted_model_folder_is_missing_not_served_from_memory(
    repo: Path, client: triton.InferenceServerClient
) -> None:
    write_null_model(repo, "doomed", toml(2, 1))
    assert ask(client, "doomed", 2).tolist() == [[0.0, 1.0]]
    client.unload_model("doomed")  # its config and the listing have been read
    assert ask(client, "resident", 2).tolist() == [[0.0, 1.0]]
    shutil.rmtree(repo / "doomed")
    with pytest.raises(InferenceServerException, match="unknown model 'doomed'") as caught:
        ask(client, "doomed", 2)
    assert caught.value.status() == "404"
    names = {row["name"] for row in client.get_model_repository_index()}
    assert "doomed" not in names and "resident" in names
    with pytest.raises(InferenceServerException, match="doomed"):
        client.load_model("doomed")


def test_a_model_added_to_the_repository_is_loaded_by_a_request(
    repo: Path, client: triton.InferenceServerClient
) -> None:
    assert ask(client, "resident", 2).tolist() == [[0.0, 1.0]]  # the listing is read
    with pytest.raises(InferenceServerException, match="unknown model 'newcomer'"):
        ask(client, "newcomer", 3)
    write_null_model(repo, "newcomer", toml(3, 1))
    assert ask(client, "newcomer", 3).tolist() == [[0.0, 1.0, 2.0]]
    assert served(client, "newcomer") == (["1"], [-1, 3])


def test_an_unchanged_config_is_parsed_once_however_often_it_loads(
    repo: Path, server: LocalServer, client: triton.InferenceServerClient
) -> None:
    write_null_model(repo, "steady", toml(2, 1))
    configs = server.dataplane.manager.repository.configs
    assert ask(client, "steady", 2).tolist() == [[0.0, 1.0]]
    parsed = configs.parsed
    for _ in range(3):
        client.unload_model("steady")
        assert ask(client, "steady", 2).tolist() == [[0.0, 1.0]]
    assert configs.parsed == parsed
