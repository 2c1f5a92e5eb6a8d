"""Warm-up as Triton does it: the batch sizes a config's model_warmup names, from zeros, random
values or a file in the model's warmup/ folder; without it, one row (not the largest batch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tests.toolkit.models import fragile_graph, save_onnx
from tests.toolkit.server import serving
from tritonclient.utils import InferenceServerException

CONFIG = """name: "fragile"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
WARMUP = """model_warmup [ {{ name: "{name}" batch_size: {rows} count: 2
  inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ 4 ] {data} }} }} }} ]
"""


def _repo(root: Path, warmup: str = "", bad_rows: int = 8) -> Path:
    save_onnx(fragile_graph(bad_rows), root / "fragile" / "1" / "model.onnx")
    (root / "fragile" / "config.pbtxt").write_text(CONFIG + warmup)
    return root


def _load_error(root: Path) -> str:
    with serving(root, load_models=()) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("fragile")
        assert caught.value.status() == "400"
        return str(caught.value)


def test_without_model_warmup_one_row_is_enough_to_be_ready(tmp_path: Path) -> None:
    # The model fails at 8 rows, its max_batch_size: warming up at the largest batch (as before)
    # refused it, and cost bert-base 32 s of start-up; one row proves it runs.
    with serving(_repo(tmp_path)) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        assert client.is_model_ready("fragile")


def test_the_batch_sizes_named_are_visited(tmp_path: Path) -> None:
    warmup = WARMUP.format(name="full batch", rows=8, data="random_data: true")
    message = _load_error(_repo(tmp_path, warmup))
    assert "failed its warm-up (full batch, batch size 8)" in message


def test_a_warm_up_file_is_read_from_the_warmup_folder(tmp_path: Path) -> None:
    repo = _repo(tmp_path, WARMUP.format(name="file", rows=4, data='input_data_file: "x.raw"'))
    (repo / "fragile" / "warmup").mkdir()
    (repo / "fragile" / "warmup" / "x.raw").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    with serving(repo) as running:
        assert httpclient.InferenceServerClient(running.http_url).is_model_ready("fragile")
    # One row is 16 bytes: a file of another size is refused, saying what it should hold.
    (repo / "fragile" / "warmup" / "x.raw").write_bytes(b"\0" * 12)
    assert "holds 12 bytes; one row of [4] FP32 is 16" in _load_error(repo)


def test_a_warm_up_file_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"\0" * 16)
    warmup = WARMUP.format(name="escape", rows=1, data='input_data_file: "../../secret"')
    assert "must be a path inside the model's folder" in _load_error(_repo(tmp_path, warmup))
