"""`dlscale zoo build`, `models check` and `run` as a user runs them (in-process)."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from dlscale.cli import main


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A repository holding the zoo's identity, built through the command line; and its output."""
    pytest.importorskip("torch", reason="building the zoo needs the [torch] extra")
    root = tmp_path_factory.mktemp("cli_zoo")
    out = io.StringIO()  # capsys is function-scoped: capture by hand
    with contextlib.redirect_stdout(out):
        assert main(["zoo", "build", str(root), "--models", "identity"]) == 0
    return root, out.getvalue()


def test_zoo_build_writes_and_names_each_model(built: tuple[Path, str]) -> None:
    root, out = built
    assert f"built {root / 'identity'}" in out
    assert (root / "identity" / "1" / "model.onnx").is_file()


def test_models_check_names_each_model_and_fails_on_a_broken_one(
    built: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = built
    assert main(["models", "check", str(root), "--load"]) == 0
    assert capsys.readouterr().out == "ok     identity (versions [1])\n"
    shutil.copytree(root / "identity", tmp_path / "identity")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.toml").write_text("max_batch_size = -1\n")
    assert main(["models", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "ok     identity (versions [1])" in out
    assert any(line.startswith("FAILED bad: ") for line in out)


def test_run_prints_latency_and_throughput(
    built: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = built
    assert main(["run", str(root), "identity", "--batch", "4", "--seconds", "0.01"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "model identity v1 on cpu"
    assert lines[1].startswith("  batch 1: median ") and " runs)" in lines[1]
    assert lines[2].startswith("  batch 4: ") and "samples/s" in lines[2]


def test_run_of_an_unknown_model_is_a_message(
    built: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = built
    assert main(["run", str(root), "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dlscale run: error: ") and "nope" in err


def test_models_convert_writes_an_equivalent_config_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.toolkit.models import identity_graph, save_onnx

    from dlscale.models.repository import ModelRepository

    folder = tmp_path / "ident"
    save_onnx(identity_graph(4, "x", "y"), folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "dynamic_batching { max_queue_delay_microseconds: 300 }\n"
        "response_cache { enable: true }\n"
        "model_operations { op_library_filename: 'x.so' }\n"
    )
    before = ModelRepository(tmp_path).config("ident")
    assert main(["models", "convert", str(tmp_path), "--dry-run"]) == 0
    assert not (folder / "config.toml").exists()
    assert main(["models", "convert", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote  {folder / 'config.toml'} from config.pbtxt (1 fields not carried over)" in out
    text = (folder / "config.toml").read_text()
    assert "#   model_operations.op_library_filename" in text
    assert "response_cache = true" in text  # acted on now: carried over
    assert ModelRepository(tmp_path).source("ident").path.name == "config.toml"
    assert ModelRepository(tmp_path).config("ident") == before
    assert main(["models", "convert", str(tmp_path)]) == 0
    assert "skip   ident: already configured by" in capsys.readouterr().out
