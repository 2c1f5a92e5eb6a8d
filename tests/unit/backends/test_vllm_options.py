"""The vLLM engine's settings from [backend_options] and Triton's model.json (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlscale.backends.generative.vllm_options import engine_settings
from dlscale.errors import ConfigError
from dlscale.models.triton_config import load_pbtxt


def hf_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


def test_backend_options_become_engine_arguments_and_environment(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "m" / "1")
    options = {
        "max_num_seqs": 8,
        "max_model_len": 256,
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_gib": 0.5,
        "cpu_threads_bind": "0-1",
        "cpu_reserved_cores": 0,
    }
    s = engine_settings(folder / "config.json", options, "cpu")
    assert s.folder == folder
    assert s.args == {
        "max_num_seqs": 8,
        "max_model_len": 256,
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_memory_bytes": 2**29,
    }
    assert s.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def test_a_gpu_instance_shows_the_engine_its_gpu_alone(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "m" / "1")
    s = engine_settings(folder / "config.json", {"gpu_memory_utilization": 0.8}, "cuda:1")
    assert s.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert s.args == {"gpu_memory_utilization": 0.8}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_seqs": True}, "max_num_seqs"),
        ({"max_model_len": "256"}, "max_model_len"),
        ({"dtype": "int4"}, "dtype"),
        ({"kv_cache_gib": -1}, "kv_cache_gib"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"cpu_threads_bind": "0; rm -rf /"}, "cpu_threads_bind"),
        ({"cpu_reserved_cores": -1}, "cpu_reserved_cores"),
        ({"trust_remote_code": True}, "trust_remote_code"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, options: dict[str, Any], named: str) -> None:
    folder = hf_folder(tmp_path / "m" / "1")
    with pytest.raises(ConfigError, match=named):
        engine_settings(folder / "config.json", options, "cpu")


def test_a_triton_model_json_passes_its_engine_arguments(tmp_path: Path) -> None:
    weights = hf_folder(tmp_path / "m" / "weights")
    version = tmp_path / "m" / "1"
    version.mkdir()
    (version / "model.json").write_text(
        json.dumps({"model": "../weights", "disable_log_requests": True, "max_num_seqs": 4})
    )
    s = engine_settings(version / "model.json", {"max_num_seqs": 2}, "cpu")
    assert s.folder == weights.resolve()
    # [backend_options] win over model.json, as dlscale's own settings.
    assert s.args == {"disable_log_requests": True, "max_num_seqs": 2}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"model": "facebook/opt-125m"}', "never downloads"),
        ('{"model": "/etc"}', "inside"),
        ('{"model": "../../outside"}', "inside"),
        ('{"max_num_seqs": 4}', "naming its 'model'"),
        ("[1, 2]", "naming its 'model'"),
        ("{not json", "not JSON"),
    ],
)
def test_a_model_json_names_a_local_folder_of_its_model(
    tmp_path: Path, text: str, why: str
) -> None:
    hf_folder(tmp_path / "outside")
    version = tmp_path / "repo" / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.json").write_text(text)
    with pytest.raises(ConfigError, match=why):
        engine_settings(version / "model.json", {}, "cpu")


def test_an_oversized_model_json_is_not_read(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.json").write_text(" " * 100_000 + "{}")
    with pytest.raises(ConfigError, match="larger than"):
        engine_settings(version / "model.json", {}, "cpu")


def test_triton_vllm_config_names_the_vllm_backend(tmp_path: Path) -> None:
    folder = tmp_path / "opt"
    folder.mkdir()
    (folder / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [{ count: 1, kind: KIND_MODEL }]\n'
        "model_transaction_policy { decoupled: true }\n"
    )
    config, _ = load_pbtxt(folder / "config.pbtxt", "opt")
    assert config.backend == "vllm"
    assert config.model_files() == ("config.json", "model.json")
