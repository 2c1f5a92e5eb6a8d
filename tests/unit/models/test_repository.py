"""The repository layout: version folders, version policies, and errors that name the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.errors import ConfigError, NotFound
from dlscale.models.repository import ModelRepository


def _model(root: Path, name: str, versions: list[int], config: str = "") -> None:
    (root / name).mkdir(parents=True)
    (root / name / "config.toml").write_text(config)
    for v in versions:
        (root / name / str(v)).mkdir()
        (root / name / str(v) / "model.onnx").write_bytes(b"not read here")


def test_versions_follow_the_policy(tmp_path: Path) -> None:
    _model(tmp_path, "latest", [1, 2, 10])
    _model(tmp_path, "every", [1, 2], "[version_policy]\nall = true\n")
    _model(tmp_path, "picked", [1, 2, 3], "[version_policy]\nspecific = [1, 3]\n")
    _model(tmp_path, "two", [1, 2, 3], "[version_policy]\nlatest = 2\n")
    repo = ModelRepository(tmp_path)
    assert [v.version for v in repo.versions("latest")] == [10]
    assert [v.version for v in repo.versions("every")] == [1, 2]
    assert [v.version for v in repo.versions("picked")] == [1, 3]
    assert [v.version for v in repo.versions("two")] == [2, 3]
    assert repo.version("every", 1).model_file == tmp_path / "every" / "1" / "model.onnx"
    with pytest.raises(NotFound, match="no version 5"):
        repo.version("every", 5)


def test_one_broken_model_never_hides_the_others(tmp_path: Path) -> None:
    _model(tmp_path, "good", [1])
    _model(tmp_path, "bad_config", [1], "max_batch_size = -1\n")
    _model(tmp_path, "no_versions", [])
    _model(tmp_path, "no_file", [])
    (tmp_path / "no_file" / "1").mkdir()
    _model(tmp_path, "policy_misses", [1], "[version_policy]\nspecific = [4]\n")
    _model(tmp_path, "not_utf8", [1])
    (tmp_path / "not_utf8" / "config.toml").write_bytes(b"\xff\xfe")
    (tmp_path / ".hidden").mkdir()
    results = {r.name: r for r in ModelRepository(tmp_path).check()}
    named = {"good", "bad_config", "no_versions", "no_file", "policy_misses", "not_utf8"}
    assert set(results) == named
    assert "not UTF-8 text" in (results["not_utf8"].error or "")
    assert results["good"].ok and results["good"].versions == (1,)
    assert "field 'max_batch_size'" in (results["bad_config"].error or "")
    assert "no version folders" in (results["no_versions"].error or "")
    assert "no model file for backend 'onnxruntime'" in (results["no_file"].error or "")
    assert "selects none of the versions on disk [1]" in (results["policy_misses"].error or "")


def test_unknown_models_and_missing_roots(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    with pytest.raises(NotFound, match="unknown model 'ghost'"):
        repo.config("ghost")
    with pytest.raises(NotFound):
        repo.config("../etc")
    with pytest.raises(ConfigError, match="is not a folder"):
        ModelRepository(tmp_path / "missing")
