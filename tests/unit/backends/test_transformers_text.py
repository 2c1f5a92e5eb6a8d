"""Streamed text of a generation: whole characters only, stop strings never sent in part."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("transformers")

from dlscale.backends.generative.transformers_text import StreamedText

#: A toy byte-level vocabulary: each id is one byte, so a character may span ids.
WORD = "naïve 🚀 ok".encode()


def decode(ids: Sequence[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def stream(text: StreamedText, data: bytes) -> list[str]:
    ids = list(data)
    return [text.update(ids[: n + 1], finished=n + 1 == len(ids)) for n in range(len(ids))]


def test_a_character_split_across_tokens_is_sent_whole() -> None:
    sent = stream(StreamedText(decode, ()), WORD)
    assert "".join(sent) == WORD.decode()
    assert all("\ufffd" not in piece for piece in sent)
    assert "🚀" in sent  # the four bytes go out together, at the last one


def test_a_stop_string_ends_the_text_before_it_and_is_never_sent_in_part() -> None:
    text = StreamedText(decode, ("🚀 o", "zzz"))
    sent = stream(text, WORD)
    assert "".join(sent) == "naïve "
    assert text.stopped


def test_the_earliest_stop_string_wins() -> None:
    text = StreamedText(decode, ("ok", "ve"))
    assert "".join(stream(text, WORD)) == "naï"


def test_without_a_stop_the_tail_is_sent_at_the_end() -> None:
    text = StreamedText(decode, ("never there",))
    sent = stream(text, b"abc")
    assert sent[:2] == ["", ""] and sent[-1] == "abc" and not text.stopped


def test_each_step_decodes_only_the_new_tokens_and_their_context() -> None:
    seen: list[int] = []

    def counting(ids: Sequence[int]) -> str:
        seen.append(len(ids))
        return decode(ids)

    data = ("long answer " * 50).encode()
    sent = stream(StreamedText(counting, ()), data)
    assert "".join(sent) == data.decode()
    assert max(seen) <= 5  # never the whole generation


def test_a_decoder_that_drops_a_leading_space_keeps_the_spaces_between_steps() -> None:
    # SentencePiece-like: a decoded text never starts with a space.
    words = ["▁the", "▁cat", "▁sat"]
    text = StreamedText(lambda ids: "".join(words[i] for i in ids).replace("▁", " ").lstrip(), ())
    sent = [text.update([0, 1, 2][: n + 1], finished=n == 2) for n in range(3)]
    assert "".join(sent) == "the cat sat"
