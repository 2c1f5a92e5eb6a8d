"""Counting tokens with the model's own tokenizer, read from its Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

from dlscale.errors import BenchError


class TokenCounter:
    """The model's tokenizer (`tokenizer.json` in its folder, read by Hugging Face `tokenizers`)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json" if folder.is_dir() else folder
        if not path.is_file():
            raise BenchError(f"--tokenizer {folder}: no tokenizer.json there")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own types for a bad file
            raise BenchError(f"--tokenizer {path}: not a tokenizer ({exc})") from None
        self.folder = folder

    def count(self, text: str) -> int:
        """Tokens in `text`, without the special tokens a prompt would get."""
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def special_ids(self) -> set[int]:
        """Ids of added (special) tokens: never drawn into a synthetic prompt."""
        return {int(i) for i in self.tokenizer.get_added_tokens_decoder()}
