"""Structured output in the transformers engine: xgrammar's JSON-schema grammars as token masks.

xgrammar (made for this, and vLLM's default structured-output backend) compiles a JSON schema
against the tokenizer's vocabulary once; each request then gets a matcher that follows its
generated tokens and says which tokens may come next. The row processors
(transformers_rows.py) ask it for that mask at each step. Whitespace is not free in the
grammar (`any_whitespace=False`), so that a small model cannot spend its tokens on blanks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from dlscale.errors import InvalidField
from dlscale.sampling import Guide


class Grammars:
    """One model's grammar compiler (compiled schemas are cached by it)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_ids)
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._vocab_size = vocab_size

    def matcher(self, guide: Guide, param: str) -> Matcher:
        """A fresh matcher for `guide`; InvalidField naming `param` when it does not compile."""
        try:
            compiled = self._compiler.compile_json_schema(guide.json_schema, any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = str(exc).rsplit(": ", 1)[-1] if ": " in str(exc) else str(exc)
            raise InvalidField(param, f"the JSON schema cannot be followed: {message}") from None
        return Matcher(xgr.GrammarMatcher(compiled), self._vocab_size)


class Matcher:
    """One request's place in its grammar."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._accepted = 0

    def mask(self, row: torch.Tensor, generated: Sequence[int]) -> None:
        """Follow the tokens generated since the last step, then leave in `row` only those
        the grammar allows next (the end token alone once the text is complete)."""
        for token in generated[self._accepted :]:
            self._matcher.accept_token(token)
        self._accepted = len(generated)
        if self._matcher.is_terminated():
            return
        self._matcher.fill_next_token_bitmask(self._bitmask)
        xgr.apply_token_bitmask_inplace(row.unsqueeze(0), self._bitmask.to(row.device))
