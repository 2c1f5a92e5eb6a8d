"""The tokenizer step: text (BYTES, UTF-8, one per row) in, token ids out, for a text model.

Hugging Face `tokenizers` reads the version folder's tokenizer.json; every row is truncated or
padded to `max_length` tokens, so the outputs are fixed INT64 [max_length] tensors:
`input_ids`, `attention_mask` and, when asked, `token_type_ids`. The batch is encoded in one
call, which runs in Rust without the GIL (over several threads for large batches). Text that
is not UTF-8 or is longer than `max_bytes` fails its own request with a 400, not the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import Field

from dlscale.backends.base import BackendOptions, RequestResult
from dlscale.backends.confined import read_confined
from dlscale.backends.processing.options import StepOptions, as_bytes, bind, read_options
from dlscale.backends.processing.step import RowsStep
from dlscale.errors import ConfigError, DlscaleError, InvalidInput, PayloadTooLarge
from dlscale.types import Datatype, TensorSpec

#: The largest tokenizer.json read: a 250k-token vocabulary with merges is about 20 MB.
MAX_TOKENIZER_BYTES = 64 * 2**20


class TokenizerOptions(StepOptions):
    """The tokenizer step's [backend_options] (docs/processing.md)."""

    #: Tokens per row: longer text is truncated, shorter padded (the model's sequence length).
    max_length: int = Field(128, ge=2, le=65536)
    #: Whether to output token_type_ids (BERT-style models that take segment ids).
    token_type_ids: bool = False
    #: The most UTF-8 bytes one row may hold, checked before tokenizing.
    max_bytes: int = Field(64 * 2**10, ge=1)
    #: The padding token, as the vocabulary spells it ("" : the tokenizer.json's own padding,
    #: else "[PAD]").
    pad_token: str = ""


class TokenizerBackend(RowsStep):
    """Tokenize a batch of texts to fixed-length INT64 ids with Hugging Face `tokenizers`."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        super().__init__(path, options)
        self.settings = read_options(TokenizerOptions, options.extra, "tokenizer")
        length = self.settings.max_length
        names = ["input_ids", "attention_mask"]
        if self.settings.token_type_ids:
            names.append("token_type_ids")
        made = [TensorSpec(n, Datatype.INT64, (-1, length)) for n in names]
        self.inputs = bind(options.inputs, [TensorSpec("text", Datatype.BYTES, (-1, 1))], "input")
        self.outputs = bind(options.outputs, made, "output")
        self._tokenizer: object | None = None

    def load(self) -> None:
        from tokenizers import Tokenizer

        self._needs_rows("tokenizer", "texts")
        data = read_confined(self.path.parent, self.path.name, MAX_TOKENIZER_BYTES, "tokenizer")
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except (UnicodeDecodeError, Exception) as exc:  # tokenizers raises a bare Exception
            raise ConfigError(f"tokenizer step: {self.path.name} cannot be read: {exc}") from None
        length = self.settings.max_length
        tokenizer.enable_truncation(length)
        pad = self.settings.pad_token or (tokenizer.padding or {}).get("pad_token", "[PAD]")
        pad_id = tokenizer.token_to_id(pad)
        if pad_id is None:
            raise ConfigError(f"tokenizer step: the vocabulary has no padding token {pad!r}")
        tokenizer.enable_padding(length=length, pad_id=pad_id, pad_token=pad)
        tokenizer.encode_batch(["warm up"])
        self._tokenizer = tokenizer

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """The texts of every valid request tokenized in one call; a bad text fails its own."""
        texts, spans = self._rows(requests, self._text)
        columns = self._encode(texts)
        return [
            span
            if isinstance(span, DlscaleError)
            else {n: a[span.start : span.stop] for n, a in columns.items()}
            for span in spans
        ]

    def _text(self, row: object, index: int) -> str:
        name = self.inputs[0].name
        try:
            data = as_bytes(row)
        except InvalidInput as exc:
            raise InvalidInput(f"input {name!r}, row {index}: the text {exc}") from None
        if len(data) > self.settings.max_bytes:
            raise PayloadTooLarge(
                f"input {name!r}, row {index}: the text is {len(data)} bytes, above the "
                f"step's max_bytes ({self.settings.max_bytes})"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"input {name!r}, row {index}: the text is not UTF-8 (byte {exc.start}: "
                f"{exc.reason})"
            ) from None

    def _encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        from tokenizers import Tokenizer

        assert isinstance(self._tokenizer, Tokenizer), "load() first"
        length = self.settings.max_length
        encodings = self._tokenizer.encode_batch(texts) if texts else []
        ids = np.array([e.ids for e in encodings], np.int64).reshape(-1, length)
        mask = np.array([e.attention_mask for e in encodings], np.int64).reshape(-1, length)
        made = {"input_ids": ids, "attention_mask": mask}
        if self.settings.token_type_ids:
            made["token_type_ids"] = np.array([e.type_ids for e in encodings], np.int64).reshape(
                -1, length
            )
        return {spec.name: made[mine] for spec, mine in zip(self.outputs, made, strict=True)}

    def unload(self) -> None:
        self._tokenizer = None
