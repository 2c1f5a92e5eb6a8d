"""Issue 36: loads that do not redo work. ONNX Runtime's optimized graph is kept once per model
file content (docs/memory.md, "Loads that do not redo work"); a reload reads it.

Each test performs its attack on a real server (tritonclient over REST, 127.0.0.1 port 0) or
on the real cache with real ONNX Runtime sessions, and asserts what happened (answers, the
cache's hit count, its files), never a time.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tests.toolkit.models import Mlp, save_onnx, write_model
from tests.toolkit.server import LocalServer, serving

from dlscale.backends.onnxruntime import FOLDER_PREFIX, GRAPHS, OptimizedGraphs

MiB = 2**20
WIDTHS = (16, 32, 4)
CONFIG = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [16]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [4]\n'
)
X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)


def padded_model(root: Path, name: str, mlp: Mlp) -> Path:
    """An ONNX model whose version folder holds 64 MiB of sparse padding: a load counts at
    least its files, so each counts 64 MiB and a 100 MiB budget holds one."""
    path = write_model(root, name, mlp.graph(), CONFIG)
    with open(path.parent / "pad.bin", "wb") as pad:
        pad.truncate(64 * MiB)
    return path


def ask(client: triton.InferenceServerClient, model: str) -> np.ndarray:
    x = triton.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(X)
    answer: np.ndarray = client.infer(model, [x]).as_numpy("y")
    return answer


def state(client: triton.InferenceServerClient, model: str) -> Any:
    return {r["name"]: r for r in client.get_model_repository_index()}[model]


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[tuple[LocalServer, triton.InferenceServerClient]]:
    """Models a and b (64 MiB each, by their files) on demand under a budget that holds one."""
    padded_model(tmp_path, "a", Mlp.seeded(361, WIDTHS))
    padded_model(tmp_path, "b", Mlp.seeded(362, WIDTHS))
    budget = (("cpu", 100 * MiB),)
    with serving(tmp_path, model_control="on-demand", load_models=(), memory_budget=budget) as s:
        client = triton.InferenceServerClient(s.http_url, network_timeout=120)
        yield s, client
        client.close()


def test_an_evicted_model_reloads_from_its_kept_graph(
    tmp_path: Path, budgeted: tuple[LocalServer, triton.InferenceServerClient]
) -> None:
    _, client = budgeted
    first = ask(client, "a")
    np.testing.assert_allclose(first, Mlp.seeded(361, WIDTHS).reference(X), rtol=1e-4, atol=1e-4)
    ask(client, "b")  # room for b: a is evicted
    assert "evicted" in state(client, "a")["reason"]
    hits = GRAPHS.hits
    again = ask(client, "a")  # loaded on demand again: from the graph kept at its first load
    assert GRAPHS.hits > hits
    np.testing.assert_array_equal(again, first)


def test_a_changed_model_file_loads_its_new_graph(
    tmp_path: Path, budgeted: tuple[LocalServer, triton.InferenceServerClient]
) -> None:
    _, client = budgeted
    ask(client, "a")
    ask(client, "b")  # a is evicted, its optimized graph kept
    changed = Mlp.seeded(363, WIDTHS)
    model = tmp_path / "a" / "1" / "model.onnx"
    size = model.stat().st_size
    save_onnx(changed.graph(), model)  # in place: same path, same size, other weights
    assert model.stat().st_size == size
    answer = ask(client, "a")
    np.testing.assert_allclose(answer, changed.reference(X), rtol=1e-4, atol=1e-4)


def test_kept_graphs_stay_private_bounded_and_go_with_the_process(tmp_path: Path) -> None:
    graph = [Mlp.seeded(370 + i, (64, 256, 4)).graph() for i in range(8)]
    files = [save_onnx(g, tmp_path / f"m{i}.onnx") for i, g in enumerate(graph)]
    size = max(f.stat().st_size for f in files)
    graphs = OptimizedGraphs(max_bytes=5 * size)  # about four graphs
    try:
        for f in files:
            assert graphs.graph(f, "all", ["CPUExecutionProvider"]) is not None
        assert graphs.folder is not None
        assert graphs.held <= graphs.max_bytes
        assert 0 < len(list(graphs.folder.iterdir())) < len(files)  # the oldest were dropped
        assert stat.S_IMODE(graphs.folder.stat().st_mode) == 0o700
        assert tmp_path not in graphs.folder.parents  # not beside the models
        assert graphs.graph(files[-1], "all", ["CPUExecutionProvider"]) is not None
        assert graphs.hits == 1
    finally:
        graphs.clear()
    assert not graphs.folder and not any(tmp_path.glob("dlscale-ort-*"))
    # A process that kept a graph and ends leaves no folder behind.
    code = (
        "import sys; from pathlib import Path; from dlscale.backends.onnxruntime import GRAPHS; "
        "GRAPHS.graph(Path(sys.argv[1]), 'all', ['CPUExecutionProvider']); print(GRAPHS.folder)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, str(files[0])], capture_output=True, text=True, check=True
    )
    folder = Path(ran.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("dlscale-ort-") and not folder.exists()


def test_the_folders_of_killed_processes_are_swept_and_the_living_ones_kept(
    tmp_path: Path,
) -> None:
    # A process killed with its graphs kept could not remove their folder: the next one does.
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    temp = Path(tempfile.gettempdir())
    left = temp / f"{FOLDER_PREFIX}{killed.pid}-{tmp_path.name}"
    kept = temp / f"{FOLDER_PREFIX}{living.pid}-{tmp_path.name}"
    graphs = OptimizedGraphs()
    try:
        for folder in (left, kept):
            folder.mkdir()
            (folder / "graph.onnx").write_bytes(b"kept graph")
        model = save_onnx(Mlp.seeded(377, (4, 8, 2)).graph(), tmp_path / "m.onnx")
        assert graphs.graph(model, "all", ["CPUExecutionProvider"]) is not None
        assert not left.exists() and (kept / "graph.onnx").read_bytes() == b"kept graph"
    finally:
        living.kill()
        living.wait()
        graphs.clear()
        for folder in (left, kept):
            shutil.rmtree(folder, ignore_errors=True)


def test_a_load_request_cannot_name_where_graphs_are_kept(tmp_path: Path) -> None:
    write_model(tmp_path, "a", Mlp.seeded(364, WIDTHS).graph(), CONFIG)
    target = tmp_path / "elsewhere" / "optimized.onnx"
    config = {
        "name": "a",
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "parameters": {
            key: {"string_value": str(target)}
            for key in ("optimized_model_filepath", "cache_dir", "folder")
        },
    }
    with serving(tmp_path, model_control="explicit", load_models=()) as server:
        client = triton.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            client.load_model("a", config=json.dumps(config))
            expected = Mlp.seeded(364, WIDTHS).reference(X)
            np.testing.assert_allclose(ask(client, "a"), expected, rtol=1e-4, atol=1e-4)
        finally:
            client.close()
    assert not target.parent.exists()
    assert GRAPHS.folder is not None and tmp_path not in GRAPHS.folder.parents
