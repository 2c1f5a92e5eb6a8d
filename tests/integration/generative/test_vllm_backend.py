"""The vLLM backend on the zoo's llama-tiny: greedy answers equal transformers' `generate`, a
closed stream aborts its sequence, bad requests are InvalidInput (make test-vllm)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("vllm", reason="the vLLM backend needs the [vllm] extra: make test-vllm")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from dlscale.backends.base import BackendOptions, StreamPart  # noqa: E402
from dlscale.backends.generative.contract import (  # noqa: E402
    FINISH_REASON,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    TEXT_INPUT,
    TEXT_OUTPUT,
    join,
)
from dlscale.backends.generative.vllm import VllmBackend  # noqa: E402
from dlscale.errors import InvalidInput  # noqa: E402
from dlscale.models.zoo.decoder import LLAMA_TINY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

#: float32 as transformers computes; a small KV cache; no compile (the tests load in ~20 s).
OPTIONS = {
    "dtype": "float32",
    "max_num_seqs": 4,
    "max_model_len": 256,
    "kv_cache_gib": 0.25,
    "enforce_eager": True,
}
PROMPTS = ("the quick brown fox", "Hello world, and then", "numbers 1 2 3 and letters a b c")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return LLAMA_TINY.build(tmp_path_factory.mktemp("vllm")) / "1"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(folder: Path) -> AsyncIterator[VllmBackend]:
    loaded = VllmBackend(folder / "config.json", BackendOptions(extra=OPTIONS))
    await asyncio.to_thread(loaded.load)
    yield loaded
    await asyncio.to_thread(loaded.unload)


@pytest.fixture(scope="module")
def reference(folder: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder)


def text_input(text: str) -> dict[str, np.ndarray]:
    return {TEXT_INPUT: np.array([text.encode()], dtype=object)}


async def parts(backend: VllmBackend, text: str, **parameters: Any) -> list[StreamPart]:
    return [p async for p in backend.stream("t", text_input(text), parameters)]


def decoded(part: StreamPart) -> tuple[str, int, str]:
    outputs = part.outputs
    return (
        bytes(outputs[TEXT_OUTPUT][0]).decode(),
        int(outputs[NUM_OUTPUT_TOKENS][0]),
        bytes(outputs[FINISH_REASON][0]).decode(),
    )


def generate(reference: tuple[Any, Any], ids: list[int], max_new_tokens: int) -> list[int]:
    model, _ = reference
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


async def test_greedy_answers_are_transformers_generate_token_for_token(
    backend: VllmBackend, reference: tuple[Any, Any]
) -> None:
    _, tokenizer = reference
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        expected = generate(reference, ids, 24)
        streamed = await parts(backend, prompt, max_tokens=24, temperature=0)
        text, count, reason = decoded(join(streamed))
        assert count == len(expected), prompt
        assert text == tokenizer.decode(expected, skip_special_tokens=True), prompt
        assert reason == ("length" if len(expected) == 24 else "stop")
        assert int(streamed[0].outputs[NUM_INPUT_TOKENS][0]) == len(ids)
        assert streamed[-1].final and not any(p.final for p in streamed[:-1])


async def test_concurrent_greedy_streams_each_get_their_own_answer(backend: VllmBackend) -> None:
    alone = [decoded(join(await parts(backend, p, max_tokens=16, temperature=0))) for p in PROMPTS]
    # Twice the engine's sequences at once: they batch, queue, and answer as they did alone.
    together = await asyncio.gather(
        *(parts(backend, p, max_tokens=16, temperature=0) for p in PROMPTS * 3)
    )
    assert [decoded(join(t)) for t in together] == alone * 3


async def test_chat_messages_are_rendered_with_the_models_template(
    backend: VllmBackend, reference: tuple[Any, Any]
) -> None:
    _, tokenizer = reference
    messages = [{"role": "user", "content": "the quick brown fox"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(rendered, add_special_tokens=False).input_ids
    expected = generate(reference, ids, 12)
    streamed = await parts(
        backend, json.dumps(messages), input_format="chat", max_tokens=12, temperature=0
    )
    text, count, _ = decoded(join(streamed))
    assert (text, count) == (tokenizer.decode(expected, skip_special_tokens=True), len(expected))
    assert int(streamed[0].outputs[NUM_INPUT_TOKENS][0]) == len(ids)


async def test_a_stop_string_ends_the_text_before_it(backend: VllmBackend) -> None:
    whole, _, _ = decoded(join(await parts(backend, PROMPTS[0], max_tokens=24, temperature=0)))
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    text, _, reason = decoded(
        join(await parts(backend, PROMPTS[0], max_tokens=24, temperature=0, stop=stop))
    )
    assert reason == "stop" and text == whole[: whole.index(stop)]


async def test_a_seeded_sample_repeats_and_another_seed_differs(backend: VllmBackend) -> None:
    async def sample(seed: int) -> str:
        streamed = await parts(backend, PROMPTS[1], max_tokens=24, temperature=1.0, seed=seed)
        return decoded(join(streamed))[0]

    first = await sample(5)
    assert await sample(5) == first
    assert await sample(6) != first


async def test_closing_a_stream_aborts_its_sequence_at_once(backend: VllmBackend) -> None:
    settings = {"temperature": 0, "ignore_eos": True}
    kept = backend.stream("kept", text_input(PROMPTS[0]), {"max_tokens": 150, **settings})
    # The longer one: were it not aborted, two sequences would run until `kept` ends.
    closed = backend.stream("closed", text_input(PROMPTS[1]), {"max_tokens": 200, **settings})
    await anext(kept)
    await anext(closed)
    await anext(kept)
    assert backend.engine_stats().running == 2
    await closed.aclose()
    running = [backend.engine_stats().running async for _ in kept]
    # The closed sequence left at once: one runs, and the last reads never saw two again.
    assert running.count(1) > 0 and 2 not in running[-3:]
    assert backend.engine_stats().running == 0


@pytest.mark.parametrize(
    ("text", "parameters", "why"),
    [
        ("word " * 300, {}, "maximum context length is 256 tokens"),
        ("fine", {"max_tokens": -1}, "max_tokens"),
        ("fine", {"temperature": 3}, "temperature"),
        ("[{]", {"input_format": "chat"}, "not JSON"),
        ('[{"role": "user"}]', {"input_format": "chat"}, "role, content"),
    ],
)
async def test_bad_requests_are_invalid_input_and_lose_nothing(
    backend: VllmBackend, text: str, parameters: dict[str, Any], why: str
) -> None:
    with pytest.raises(InvalidInput, match=why):
        await parts(backend, text, **parameters)
    _, count, _ = decoded(join(await parts(backend, "still served", max_tokens=3, ignore_eos=True)))
    assert count == 3


async def test_two_prompts_in_one_request_are_refused(backend: VllmBackend) -> None:
    two = {TEXT_INPUT: np.array([b"a", b"b"], dtype=object)}
    with pytest.raises(InvalidInput, match="one text_input"):
        [p async for p in backend.stream("t", two, {})]


async def test_the_engine_reports_its_scheduler_state(backend: VllmBackend) -> None:
    await parts(backend, PROMPTS[0], max_tokens=4)
    stats = backend.engine_stats()
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (0, 0, 0.0)
    assert backend.capabilities.streams_answers and backend.capabilities.generates_text


async def test_logprobs_come_in_the_contracts_shape(backend: VllmBackend) -> None:
    from dlscale.backends.generative.contract import LOGPROBS
    from dlscale.sampling import Sampling

    typed = Sampling(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=2)
    got = [p async for p in backend.generate("lp", text_input("Once upon"), typed)]
    rows = [row for p in got for row in json.loads(str(p.parameters.get(LOGPROBS, "[]")))]
    assert len(rows) == 3
    for token, logprob, top in rows:
        assert isinstance(token, str) and logprob <= 0 and len(top) == 2
        assert logprob == pytest.approx(top[0][1])  # greedy: the best one


async def test_a_token_id_prompt_answers_as_its_text(
    backend: VllmBackend, reference: tuple[Any, Any]
) -> None:
    from dlscale.sampling import Sampling

    _, tokenizer = reference
    ids = list(tokenizer("the quick brown fox").input_ids)
    greedy = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    by_text = [
        p
        async for p in backend.generate(
            "t1", text_input(tokenizer.decode(ids, skip_special_tokens=True)), Sampling(**greedy)
        )
    ]
    by_ids = [
        p
        async for p in backend.generate(
            "t2", text_input(json.dumps(ids)), Sampling(input_format="tokens", **greedy)
        )
    ]
    assert joined(by_ids) == joined(by_text) != ""


async def test_a_json_schema_holds_the_answer_to_its_enum(backend: VllmBackend) -> None:
    from dlscale.sampling import Guide, Sampling

    schema = json.dumps({"type": "string", "enum": ["red", "green", "blue"]})
    typed = Sampling(max_tokens=16, temperature=0.0, guide=Guide("json_schema", schema))
    got = [p async for p in backend.generate("js", text_input("My favourite colour is"), typed)]
    assert json.loads(joined(got)) in ("red", "green", "blue")


def joined(got: list[StreamPart]) -> str:
    """The text of a stream's parts."""
    texts = [p.outputs[TEXT_OUTPUT][0] for p in got if TEXT_OUTPUT in p.outputs]
    return "".join(bytes(t).decode() for t in texts)


async def test_tools_are_rendered_by_the_chat_template(backend: VllmBackend) -> None:
    from dlscale.sampling import Sampling

    messages = text_input(json.dumps([{"role": "user", "content": "What is the weather?"}]))
    tool = {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
    }

    async def prompt_tokens(tools: str) -> int:
        typed = Sampling(max_tokens=1, temperature=0.0, input_format="chat", tools=tools)
        got = [p async for p in backend.generate("tools", messages, typed)]
        counts = [int(p.outputs[NUM_INPUT_TOKENS][0]) for p in got if NUM_INPUT_TOKENS in p.outputs]
        return counts[-1]

    assert await prompt_tokens(json.dumps([tool])) > await prompt_tokens("")
