"""The zoo's Llama decoders: the repository layout, the Hugging Face files, reproducible builds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dlscale.errors import NotFound
from dlscale.models.config import load_config
from dlscale.models.zoo import DECODERS, ZOO, build_zoo
from dlscale.models.zoo.decoder import LLAMA_1B, LLAMA_TINY
from dlscale.models.zoo.decoder_tokenizer import BOS, TURN_END

transformers = pytest.importorskip("transformers")

HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    [folder] = build_zoo(root, ["llama-tiny"])
    return folder


def test_the_repository_model_names_the_transformers_backend(built: Path) -> None:
    config = load_config(built / "config.toml", expected_name="llama-tiny")
    assert config.backend == "transformers"
    assert config.max_batch_size == 0
    assert {p.name for p in (built / "1").iterdir()} == HF_FILES


def test_transformers_loads_the_folder_with_the_declared_shape(built: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(built / "1")
    tokenizer = transformers.AutoTokenizer.from_pretrained(built / "1")
    assert sum(p.numel() for p in model.parameters()) == LLAMA_TINY.parameters()
    # Exactly one embedding row per tokenizer id: every id the model emits decodes.
    assert model.config.vocab_size == len(tokenizer) == LLAMA_TINY.vocab_size
    assert model.config.max_position_embeddings == LLAMA_TINY.max_positions


def test_the_tokenizer_is_byte_level_and_starts_with_bos(built: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(built / "1")
    text = "Hello world: ünïcødé, 数字 and emoji 🚀 tabs\tand\nnewlines"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids(BOS)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Common words are whole tokens, as with a real vocabulary.
    assert len(tokenizer(" and of to in").input_ids) == 5


def test_the_chat_template_spells_turns_with_special_tokens(built: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(built / "1")
    messages = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith(BOS) and text.endswith("assistant<|end_header_id|>\n\n")
    assert f"hi{TURN_END}" in text
    # The end of a turn ends a generation (Llama 3's <|eot_id|>).
    config = json.loads((built / "1" / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids(TURN_END) in config["eos_token_id"]


def test_a_rebuild_gives_the_same_bytes(built: Path, tmp_path: Path) -> None:
    again = LLAMA_TINY.build(tmp_path)
    for name in sorted(HF_FILES):
        first, second = (built / "1" / name).read_bytes(), (again / "1" / name).read_bytes()
        assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest(), name


def test_the_decoders_are_built_by_name_only(tmp_path: Path) -> None:
    assert not set(DECODERS) & set(ZOO)
    assert LLAMA_1B.on_request and 1.0e9 < LLAMA_1B.parameters() < 1.3e9
    with pytest.raises(NotFound, match="llama-tiny"):
        build_zoo(tmp_path, ["llama-huge"])
