"""Every config.toml the docs show, whole or a table of one, loads with the model config loader:
a field renamed or a value no longer accepted fails here, not in a user's repository."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from tests.toolkit.doc_blocks import DOCS, code_blocks

from dlscale.models.config import load_config

#: What a table shown alone ([qos], [memory], [routing]) is read inside: a model of its own.
_AROUND = 'backend = "null"\nmax_batch_size = 4\n'
CONFIGS = [(doc.name, text) for doc in DOCS for lang, text in code_blocks(doc) if lang == "toml"]


def test_the_docs_show_configs() -> None:
    # So that a fence this file misreads cannot leave it checking nothing.
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("text", [t for _, t in CONFIGS], ids=[d for d, _ in CONFIGS])
def test_a_documented_config_loads(text: str, tmp_path: Path) -> None:
    fields = tomllib.loads(text)
    whole = any(not isinstance(value, dict) for value in fields.values())
    name = str(fields.get("name", "shown"))
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.toml").write_text(text if whole else _AROUND + text)
    load_config(folder / "config.toml", name)
