"""Token ids to streamed text: whole characters only, stop strings cut and never sent in part."""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: What a decoder gives for bytes that do not yet make a whole UTF-8 character.
_PARTIAL = "\ufffd"
#: Tokens decoded before the new ones, so that a decoder that treats the first token of a text
#: apart (SentencePiece drops its leading space) sees them in context.
_CONTEXT = 4


class StreamedText:
    """The text of one generation, released as it grows.

    Decoding token by token would split a character whose bytes span tokens (byte-level BPE),
    and decoding the whole generation each step costs the event loop its square; so each step
    decodes the tokens since the last whole character, with a few before them for context, and
    only the part past what was sent goes out. A replacement character at the end is held back
    until its bytes complete; with stop strings, the last `longest stop - 1` characters are
    held back too, so that a stop string split across steps is never sent in part.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str]) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._sent = 0
        self.stopped = False
        #: The text of tokens[: self._base], which ends on a whole character.
        self._text = ""
        self._base = 0

    def update(self, tokens: Sequence[int], finished: bool) -> str:
        """The new text that `tokens` (the whole generation so far) adds; sets `stopped` when
        a stop string appears (the text ends before it)."""
        text = self._decoded(tokens)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            text, finished = text[:cut], True
        end = len(text)
        if not finished:
            end -= self._hold
            while end > self._sent and text[end - 1] == _PARTIAL:
                end -= 1
        if end <= self._sent:
            return ""
        new, self._sent = text[self._sent : end], end
        return new

    def _decoded(self, tokens: Sequence[int]) -> str:
        """The whole generation's text, decoding only its new tokens (and their context)."""
        start = max(0, self._base - _CONTEXT)
        before = self._decode(tokens[start : self._base])
        window = self._decode(tokens[start:])
        if window.startswith(before):
            text = self._text + window[len(before) :]
        else:  # the new tokens changed how the earlier ones decode: decode them all
            text = self._decode(tokens)
        if not text.endswith(_PARTIAL):
            self._text, self._base = text, len(tokens)
        return text

    def _first_stop(self, text: str) -> int | None:
        # Only the text not yet sent and the held-back tail can hold a new stop string.
        start = max(0, self._sent - self._hold)
        found = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
        return min(found) if found else None
