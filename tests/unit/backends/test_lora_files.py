"""An adapter folder is read as data and bounded before a tensor is: the zoo's adapter passes;
pickles and code are refused (PermissionDenied); a config beyond plain, bounded LoRA and a
weights file that is not what the config says are refused naming what is wrong."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")

from dlscale.backends import check_upload, uploadable  # noqa: E402
from dlscale.backends.generative.lora_files import read_adapter, read_config  # noqa: E402
from dlscale.errors import ConfigError, PermissionDenied  # noqa: E402
from dlscale.models.zoo.lora import ADAPTERS  # noqa: E402

ADAPTER = ADAPTERS["llama-tiny-lora-1"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return ADAPTER.write_peft(tmp_path / "1")


def _config(**changes: Any) -> bytes:
    return json.dumps({**ADAPTER.peft_config(), **changes}).encode()


def test_the_zoos_adapter_reads_with_its_rank_scale_and_shapes(folder: Path) -> None:
    spec = read_adapter(folder, max_rank=16)
    assert (spec.rank, spec.scale) == (8, 2.0)
    assert spec.shapes["model.layers.0.self_attn.k_proj"] == ((8, 128), (64, 8))
    assert len(spec.shapes) == 4 * 4


@pytest.mark.parametrize("name", ["adapter_model.bin", "model.py", "pytorch_model.pt"])
def test_a_file_that_is_not_an_adapters_data_is_refused(folder: Path, name: str) -> None:
    (folder / name).write_bytes(b"\x80\x04K.")
    with pytest.raises(PermissionDenied, match=name):
        read_adapter(folder)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"r": 64}, r"r \(the rank\) must be an integer 1\.\.16, not 64"),
        ({"r": True}, "r \\(the rank\\)"),
        ({"peft_type": "IA3"}, "is not LORA"),
        ({"target_modules": ".*proj"}, "a regular expression is not taken"),
        ({"target_modules": ["q_proj"] * 65}, "1..64 module names"),
        ({"use_dora": True}, "use_dora = True is not served"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "all"}, "bias = 'all'"),
        ({"lora_alpha": -1}, "lora_alpha must be a positive number"),
        ({"pad": "x" * 70_000}, "above 65536"),
    ],
)
def test_a_config_beyond_plain_bounded_lora_is_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        read_config(_config(**changes), max_rank=16)


def test_weights_that_the_config_does_not_describe_are_refused(folder: Path) -> None:
    weights = folder / "adapter_model.safetensors"
    (folder / "adapter_config.json").write_bytes(_config(r=4))
    with pytest.raises(ConfigError, match=r"needs lora_A \[4, in\]"):
        read_adapter(folder)
    (folder / "adapter_config.json").write_bytes(_config(target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="is no LoRA A/B of a target"):
        read_adapter(folder)
    weights.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ConfigError, match="is not a safetensors file"):
        read_adapter(folder)


def test_a_load_request_may_upload_the_two_files_only() -> None:
    assert uploadable("lora", "adapter_config.json")
    assert uploadable("lora", "adapter_model.safetensors")
    assert not uploadable("lora", "adapter_model.bin")
    assert not uploadable("lora", "model.py")
    with pytest.raises(ConfigError, match="use_dora"):
        check_upload("lora", "adapter_config.json", _config(use_dora=True))
