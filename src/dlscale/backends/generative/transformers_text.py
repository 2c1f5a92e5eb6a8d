"""Token ids to streamed text: whole characters only, stop strings cut and never sent in part."""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: What a decoder gives for bytes that do not yet make a whole UTF-8 character.
_PARTIAL = "\ufffd"


class StreamedText:
    """The text of one generation, released as it grows.

    Decoding token by token would split a character whose bytes span tokens (byte-level BPE),
    so the whole generation is decoded each step and only the part past what was sent goes
    out. A replacement character at the end is held back until its bytes complete; with stop
    strings, the last `longest stop - 1` characters are held back too, so that a stop string
    split across steps is never sent in part.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str]) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._sent = 0
        self.stopped = False

    def update(self, tokens: Sequence[int], finished: bool) -> str:
        """The new text that `tokens` (the whole generation so far) adds; sets `stopped` when
        a stop string appears (the text ends before it)."""
        text = self._decode(tokens)
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

    def _first_stop(self, text: str) -> int | None:
        # Only the text not yet sent and the held-back tail can hold a new stop string.
        start = max(0, self._sent - self._hold)
        found = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
        return min(found) if found else None
