"""Endpoint bodies and events, traces and synthetic prompts: what the generative bench reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.bench.generative.endpoints import Ask, Endpoint, read_event, request_body
from dlscale.bench.generative.load import poisson_offsets
from dlscale.bench.generative.options import parse_list
from dlscale.bench.generative.prompts import Lengths, PromptMaker, synthetic_asks
from dlscale.bench.generative.trace import read_trace
from dlscale.errors import BenchError


def test_bodies_ask_for_a_stream_of_max_tokens() -> None:
    ask = Ask("hi", 8)
    chat = request_body(Endpoint.CHAT, "m", ask)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}
    assert (chat["max_tokens"], chat["ignore_eos"]) == (8, True)
    assert request_body(Endpoint.COMPLETIONS, "m", ask)["prompt"] == "hi"
    generate = request_body(Endpoint.GENERATE, "m", Ask("hi", 8, ignore_eos=False))
    assert generate == {"text_input": "hi", "stream": True, "max_tokens": 8}
    assert Endpoint.GENERATE.path("llama") == "/v2/models/llama/generate_stream"


def test_events_of_each_kind() -> None:
    chunk = {"choices": [{"delta": {"content": "ab"}, "finish_reason": None}]}
    assert read_event(Endpoint.CHAT, json.dumps(chunk)).text == "ab"
    usage = {"choices": [], "usage": {"completion_tokens": 9, "prompt_tokens": 4}}
    event = read_event(Endpoint.COMPLETIONS, json.dumps(usage))
    assert (event.text, event.tokens, event.prompt_tokens) == ("", 9, 4)
    oip = {"text_output": "x", "num_output_tokens": 3, "finish_reason": "length"}
    event = read_event(Endpoint.GENERATE, json.dumps(oip))
    assert (event.text, event.tokens, event.finish_reason) == ("x", 3, "length")
    assert read_event(Endpoint.CHAT, "[DONE]").done
    assert read_event(Endpoint.CHAT, '{"error": {"message": "too long"}}').error == "too long"
    assert "not JSON" in (read_event(Endpoint.GENERATE, "{oops").error or "")


def test_trace_sorted_offsets_and_bounds(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 1500, "input_length": 8, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 1000, "text": "hello there", "output_length": 2},
        {"timestamp": 1250, "input_length": 5, "output_length": 3},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    entries = read_trace(path)
    assert [e.offset_s for e in entries] == [0.0, 0.25, 0.5]
    assert entries[0].text == "hello there" and entries[2].input_length == 8


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": -1, "input_length": 4, "output_length": 4}', "timestamp"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 4}', "input_length"),
        ('{"timestamp": 0, "input_length": 4, "output_length": 100000000}', "output_length"),
        ('{"timestamp": 0, "text": "", "output_length": 4}', "text"),
        ("[1, 2]", "JSON object"),
        ("{nope", "not JSON"),
    ],
)
def test_bad_trace_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(BenchError, match=message) as caught:
        read_trace(path)
    assert "bad.jsonl:1" in str(caught.value)


def test_synthetic_lengths_are_seeded_and_bounded() -> None:
    a = synthetic_asks(PromptMaker(None, seed=3), 20, Lengths(16, 4), Lengths(8, 2))
    b = synthetic_asks(PromptMaker(None, seed=3), 20, Lengths(16, 4), Lengths(8, 2))
    assert [x[0] for x in a] == [x[0] for x in b]
    assert all(n >= 1 for _, n in a) and len({n for _, n in a}) > 1
    with pytest.raises(BenchError, match="--isl"):
        synthetic_asks(PromptMaker(None, seed=3), 2, Lengths(0), Lengths(8))
    with pytest.raises(BenchError, match="--requests"):
        synthetic_asks(PromptMaker(None, seed=3), 0, Lengths(4), Lengths(8))


def test_poisson_offsets_and_lists() -> None:
    offsets = poisson_offsets(200, 50.0, seed=1)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 2.0 < offsets[-1] < 6.0  # 199 gaps of mean 20 ms
    assert parse_list("1,4,16", int, "--concurrency") == (1, 4, 16)
    with pytest.raises(BenchError, match="comma-separated"):
        parse_list("1,x", int, "--concurrency")
