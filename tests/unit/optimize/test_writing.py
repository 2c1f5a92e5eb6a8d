"""Writing the winner as the next version: its file by name, its backend and its options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomli_w

from dlscale.errors import OptimizeError
from dlscale.models.config import load_config
from dlscale.models.repository import ModelRepository
from dlscale.optimize.staging import backend_options_of, derived_config, stage
from dlscale.optimize.variants import Variant
from dlscale.optimize.writing import staged_model_file, write_version

SPEC = {
    "factory": "dlscale.models.zoo.nets.small:make_identity",
    "kwargs": {"seed": 0},
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}],
    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 16]}],
}
TORCH_BF16 = Variant(
    "torch-bf16", "bf16", "torch-module", {}, {"precision": "bf16"}, runtime="torch", lossy=True
)


def _repo(root: Path, policy: dict[str, object] | None = None) -> ModelRepository:
    folder = root / "repo" / "ident"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"onnx bytes")
    np.savez(str(folder / "1" / "validation.npz"), input=np.zeros((2, 16), np.float32))
    config: dict[str, object] = {
        "name": "ident",
        "max_batch_size": 8,
        "backend_options": {"intra_op_threads": 1, "prefer_nhwc": True},
    }
    if policy is not None:
        config["version_policy"] = policy
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    return ModelRepository(root / "repo")


def _staged(root: Path, repo: ModelRepository) -> Path:
    source = repo.version("ident")
    spec = root / "build" / "model.zoo"
    spec.parent.mkdir()
    spec.write_text(tomli_w.dumps(SPEC))
    config = derived_config(
        source.config,
        "torch-bf16",
        backend="torch",
        backend_options=backend_options_of(source.config, {"precision": "bf16"}, "torch"),
    )
    return stage(root / "staged", "torch-bf16", config, spec, {"input": np.ones((2, 16))})


def test_another_backend_keeps_only_the_generic_options() -> None:
    config = load_config_from({"name": "m", "backend_options": {"tensorrt": True}})
    assert backend_options_of(config, {"precision": "bf16"}, "torch") == {
        "intra_op_threads": 0,
        "inter_op_threads": 0,
        "graph_optimization_level": "all",
        "precision": "bf16",
    }
    assert backend_options_of(config, {"trt_fp16": True})["tensorrt"] is True


def load_config_from(data: dict[str, object]):  # type: ignore[no-untyped-def]
    from dlscale.models.config import parse_config

    return parse_config(data, "<test>")


def test_a_torch_winner_is_written_with_its_file_backend_and_options(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    staged = _staged(tmp_path, repo)
    assert staged_model_file(staged, "torch").name == "model.zoo"
    version, target, previous = write_version(repo, repo.version("ident"), TORCH_BF16, staged)
    assert version == 2 and (target / "model.zoo").is_file()
    assert not (target / "model.onnx").exists() and (target / "validation.npz").is_file()
    config = load_config(target.parent / "config.toml", "ident")
    assert config.backend == "torch" and previous["backend"] == "onnxruntime"
    assert config.backend_options.model_extra == {"precision": "bf16"}
    assert config.backend_options.intra_op_threads == 1
    assert config.metadata["optimized_variant"] == "torch-bf16"
    served = repo.version("ident")
    assert served.version == 2 and served.model_file == target / "model.zoo"


def test_a_policy_that_would_serve_onnx_versions_under_torch_is_narrowed(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"all": True})
    staged = _staged(tmp_path, repo)
    version, target, _ = write_version(repo, repo.version("ident"), TORCH_BF16, staged)
    config = load_config(target.parent / "config.toml", "ident")
    assert config.version_policy.specific == [version]
    assert [v.version for v in repo.versions("ident")] == [2]


def test_a_staged_folder_without_the_backend_file_is_an_error(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    staged = _staged(tmp_path, repo)
    with pytest.raises(OptimizeError, match="no model file for backend 'onnxruntime'"):
        staged_model_file(staged, "onnxruntime")
