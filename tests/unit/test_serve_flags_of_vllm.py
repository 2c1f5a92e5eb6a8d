"""`dlscale serve` as `vllm serve`: a Hugging Face folder becomes a one-model repository whose
config says what vLLM's flags asked; flags an engine has no setting for are refused naming
what to use instead, and so are they all with a repository (its models' configs say it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlscale.cli import parse
from dlscale.errors import ConfigError
from dlscale.models.repository import ModelRepository
from dlscale.server_settings import ServerSettings
from dlscale.server_settings.flags import settings_from


def hf_folder(root: Path, *files: str) -> Path:
    root.mkdir(parents=True)
    for name in files or ("config.json", "tokenizer.json", "model.safetensors"):
        (root / name).write_text('{"max_position_embeddings": 512}')
    return root


def served(argv: list[str]) -> tuple[str, Any]:
    """The one model a command line serves: its name and config."""
    settings = settings_from(parse(["serve", *argv]))
    repository = ModelRepository(settings.repository)
    [name] = repository.names()
    return name, repository.config(name)


def test_model_is_vllms_repo_and_no_longer_an_ambiguous_prefix() -> None:
    settings = settings_from(parse(["serve", "--model", "repo", "--port", "9000"]))
    assert settings == ServerSettings(Path("repo")).replace(http_port=9000)


def test_a_folder_is_served_under_its_name_with_the_flags_as_options(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "llama" / "1")
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    name, config = served(
        [str(folder), "--max-model-len", "128", "--dtype", "half", "--chat-template",
         str(template), "--kv-cache-memory-bytes", str(2**29), "--device", "cpu"]
    )  # fmt: skip
    assert name == "llama"  # a version folder is named after its model
    assert config.backend == "transformers" and config.max_batch_size == 0
    assert config.backend_options.model_extra == {
        "max_model_len": 128,
        "dtype": "float16",
        "kv_cache_gib": 0.5,
        "chat_template": str(template.resolve()),
    }
    assert config.metadata["max_model_len"] == 128


def test_served_model_name_and_the_vllm_engine(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "weights")
    name, config = served(
        [str(folder), "--served-model-name", "chat", "--engine", "vllm", "-tp", "2",
         "--enable-prefix-caching", "--gpu-memory-utilization", "0.5", "--device", "cuda:0"]
    )  # fmt: skip
    assert name == "chat" and config.backend == "vllm"
    assert config.backend_options.model_extra == {
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.5,
        "tensor_parallel_size": 2,
    }
    assert config.metadata["max_model_len"] == 512  # config.json's, for /v1/models


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["-tp", "2"], "--tensor-parallel-size: the transformers engine runs a model on one"),
        (["--no-enable-prefix-caching"], "always shares the KV-cache blocks"),
        (["--gpu-memory-utilization", "0.5", "--device", "cpu"], "--kv-cache-memory-bytes"),
        (["--gpu-memory-utilization", "1.5"], "a share, above 0 and at most 1"),
        (["--max-model-len", "0"], "--max-model-len 0: 1 or more"),
        (["--served-model-name", "a/b"], "a model name has no '/'"),
        (["--chat-template", "missing.jinja"], "no such file"),
    ],
)
def test_flags_an_engine_cannot_honour_are_refused(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    folder = hf_folder(tmp_path / "m")
    with pytest.raises(ConfigError, match=said):
        settings_from(parse(["serve", str(folder), *flags]))


def test_a_folder_without_weights_is_refused_naming_them(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "m", "config.json", "tokenizer.json")
    with pytest.raises(ConfigError, match=r"holds config.json but not weights \(\*.safetensors"):
        settings_from(parse(["serve", str(folder)]))


def test_a_repository_takes_none_of_the_folder_flags(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--served-model-name, --max-model-len: these set how"):
        settings_from(
            parse(["serve", str(tmp_path), "--max-model-len", "64", "--served-model-name", "x"])
        )
