"""Which config a model folder is read with: config.toml, config.pbtxt, model-settings.json, or
its ONNX file alone (auto-complete); and the layouts the repository serves versions from."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tests.toolkit.models import identity_graph, save_onnx, scale_graph

from dlscale.errors import ConfigError
from dlscale.models.repository import ModelRepository
from dlscale.models.sources import AUTO_MAX_BATCH_SIZE, read_source


def test_config_toml_wins_then_pbtxt_then_model_settings(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    save_onnx(identity_graph(4), folder / "1" / "model.onnx")
    (folder / "model-settings.json").write_text(json.dumps({"name": "m", "max_batch_size": 0}))
    assert read_source(folder, "m").path.name == "model-settings.json"
    (folder / "config.pbtxt").write_text("max_batch_size: 2\n")
    assert read_source(folder, "m").config.max_batch_size == 2
    (folder / "config.toml").write_text("max_batch_size = 3\n")
    found = read_source(folder, "m")
    assert (found.path.name, found.config.max_batch_size) == ("config.toml", 3)


def test_a_lone_onnx_file_is_completed_as_triton_does(tmp_path: Path) -> None:
    save_onnx(identity_graph(4), tmp_path / "batching" / "3" / "model.onnx")
    save_onnx(scale_graph(2.0, [2, 3]), tmp_path / "fixed" / "1" / "model.onnx")
    batching = read_source(tmp_path / "batching", "batching")
    assert batching.config.max_batch_size == AUTO_MAX_BATCH_SIZE == 4
    assert batching.path == tmp_path / "batching" / "3" / "model.onnx"
    assert read_source(tmp_path / "fixed", "fixed").config.max_batch_size == 0
    # A config.pbtxt that says nothing of tensors or batching is completed the same way.
    (tmp_path / "batching" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    assert read_source(tmp_path / "batching", "batching").config.max_batch_size == 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.toml, config\.pbtxt, model-settings\.json"):
        read_source(tmp_path / "empty", "empty")


def test_mlservers_layout_serves_the_file_beside_its_settings(tmp_path: Path) -> None:
    folder = tmp_path / "ident"
    save_onnx(identity_graph(4), folder / "model.onnx")
    settings = {"name": "ident", "implementation": "x.Y", "parameters": {"uri": "./model.onnx"}}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    (version,) = ModelRepository(tmp_path).versions("ident")
    assert (version.version, version.model_file) == (1, folder / "model.onnx")
    assert version.source == folder / "model-settings.json"


def test_one_warning_names_the_fields_not_acted_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "m"
    save_onnx(identity_graph(4), folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        "max_batch_size: 4\nresponse_cache { enable: true }\nmodel_warmup [ { name: 'w' } ]\n"
        "model_operations { op_library_filename: 'x.so' }\n"
    )
    with caplog.at_level(logging.WARNING, logger="dlscale.models"):
        ModelRepository(tmp_path).versions("m")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{folder / 'config.pbtxt'}: fields dlscale does not act on: "
        "model_operations.op_library_filename"
    ]


@pytest.mark.parametrize("file", ["config.toml", "config.pbtxt", "model-settings.json"])
def test_a_config_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path, file: str) -> None:
    # A UnicodeDecodeError once, which took the whole server down at start: one model's file
    # fails that model alone (tests/unit/models/test_repository.py: the others are served).
    (tmp_path / file).write_bytes(b'name = "m"\n\xff\xfe')
    with pytest.raises(ConfigError, match=f"{file}: not UTF-8 text"):
        read_source(tmp_path, "m")
