"""A request trace replayed on its timestamps (JSONL, mooncake-like; docs/bench.md).

One JSON object per line: `timestamp` (milliseconds from the trace's start; the first line
need not be 0), `input_length` (prompt tokens; a synthetic prompt of that length is made) or
`text` (the prompt itself), and `output_length` (tokens to generate). Other keys (mooncake's
`hash_ids`) are ignored. Lines are sorted by timestamp; the replay sends each request at its
offset from the first, divided by `speedup`. Everything is bounded before use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.bench.generative.endpoints import Ask
from dlscale.bench.generative.prompts import (
    MAX_OUTPUT_TOKENS,
    MAX_REQUESTS,
    MAX_TOKENS_PER_PROMPT,
    PromptMaker,
)
from dlscale.bench.trace import json_lines
from dlscale.errors import BenchError

MAX_LINE_BYTES = 1 << 20
MAX_TRACE_BYTES = 256 << 20


@dataclass(frozen=True)
class TraceEntry:
    """One line of a trace."""

    offset_s: float
    output_length: int
    input_length: int | None = None
    text: str | None = None


def read_trace(path: Path) -> list[TraceEntry]:
    """The trace's entries by time, offsets from the earliest; BenchError names a bad line."""
    lines = json_lines(path, MAX_TRACE_BYTES, MAX_LINE_BYTES, MAX_REQUESTS)
    entries = [_entry(doc, where) for where, doc in lines]
    entries.sort(key=lambda e: e[0])
    start = entries[0][0]
    return [
        TraceEntry((ms - start) / 1e3, e.output_length, e.input_length, e.text) for ms, e in entries
    ]


def _entry(doc: dict[str, object], where: str) -> tuple[float, TraceEntry]:
    stamp = doc.get("timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not 0 <= stamp < 1e12:
        raise BenchError(f"{where}: timestamp must be milliseconds >= 0, not {stamp!r}")
    out = _length(doc, "output_length", MAX_OUTPUT_TOKENS, where)
    text = doc.get("text")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise BenchError(f"{where}: text must be a non-empty string")
        return float(stamp), TraceEntry(0.0, out, None, text)
    isl = _length(doc, "input_length", MAX_TOKENS_PER_PROMPT, where)
    return float(stamp), TraceEntry(0.0, out, isl)


def _length(doc: dict[str, object], key: str, most: int, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BenchError(f"{where}: {key} must be an integer 1 to {most}, not {value!r}")
    return value


def trace_asks(entries: list[TraceEntry], maker: PromptMaker) -> list[tuple[Ask, int, float]]:
    """Each entry's request, its prompt's token count, and its offset in seconds."""
    out = []
    for e in entries:
        if e.text is not None:
            text = e.text
            count = maker.counter.count(text) if maker.counter else 0
        else:
            assert e.input_length is not None
            text, count = maker.prompt(e.input_length)
        out.append((Ask(text, e.output_length), count, e.offset_s))
    return out
