"""The transformers backend on the zoo's llama-tiny: greedy equal to `generate`, seeded draws,
cancellation, stop strings, chat, bounds; one engine for the module."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from dlscale.backends import BackendOptions, create_backend  # noqa: E402
from dlscale.backends.base import StreamPart  # noqa: E402
from dlscale.backends.generative.contract import GenerativeBackend  # noqa: E402
from dlscale.backends.generative.transformers_request import prepare  # noqa: E402
from dlscale.errors import BackendError, ConfigError, InvalidInput, Unavailable  # noqa: E402
from dlscale.models.zoo import build_zoo  # noqa: E402
from dlscale.sampling import MAX_TOKENS_DEFAULT, Sampling  # noqa: E402

PROMPTS = (
    "Hello world, tell me a story",
    "the cat",
    "Why is the sky blue? Explain it in words a child knows",
    "a",
    "GPU memory and the cache",
)
GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    [model] = build_zoo(tmp_path_factory.mktemp("llm"), ["llama-tiny"])
    return model / "1"


@pytest.fixture(scope="module")
def backend(folder: Path) -> Iterator[GenerativeBackend]:
    loaded = create_backend(
        "transformers", folder / "config.json", BackendOptions(extra={"kv_cache_gib": 0.0625})
    )
    loaded.load()
    assert isinstance(loaded, GenerativeBackend)
    yield loaded
    loaded.unload()


def text_input(text: str) -> dict[str, np.ndarray]:
    return {"text_input": np.array([text.encode()], dtype=object)}


async def collect(
    backend: GenerativeBackend, prompt: str, parameters: Mapping[str, Any]
) -> list[StreamPart]:
    return [p async for p in backend.stream("r", text_input(prompt), parameters)]


def text_of(parts: list[StreamPart]) -> str:
    return "".join(bytes(p.outputs["text_output"][0]).decode() for p in parts)


def last(parts: list[StreamPart], name: str) -> Any:
    value = parts[-1].outputs[name][0]
    return value.decode() if isinstance(value, bytes) else int(value)


@functools.cache
def hf_model(folder: Path) -> tuple[Any, Any]:
    """transformers' own tokenizer and model on the same folder, loaded once."""
    return (
        transformers.AutoTokenizer.from_pretrained(folder),
        transformers.AutoModelForCausalLM.from_pretrained(folder),
    )


def reference(folder: Path, prompt: str, max_tokens: int) -> tuple[str, int]:
    """transformers' own greedy `generate` on the same weights: (text, tokens)."""
    tokenizer, model = hf_model(folder)
    ids = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False)[0]
    new = out[ids.input_ids.shape[1] :]
    return tokenizer.decode(new, skip_special_tokens=True), len(new)


async def test_greedy_equals_generate_for_concurrent_requests(
    backend: GenerativeBackend, folder: Path
) -> None:
    # All at once, so that the engine runs them in the same steps.
    answers = await asyncio.gather(*(collect(backend, p, GREEDY) for p in PROMPTS))
    for prompt, parts in zip(PROMPTS, answers, strict=True):
        want_text, want_tokens = reference(folder, prompt, GREEDY["max_tokens"])
        assert text_of(parts) == want_text, prompt
        assert last(parts, "num_output_tokens") == want_tokens
        assert parts[-1].final and not any(p.final for p in parts[:-1])
        assert last(parts, "finish_reason") == ("length" if want_tokens == 24 else "stop")
        # One part per generated token, counts rising by one.
        assert [int(p.outputs["num_output_tokens"][0]) for p in parts] == list(
            range(1, want_tokens + 1)
        )


async def test_a_seeded_draw_repeats_whatever_runs_beside_it(backend: GenerativeBackend) -> None:
    seeded = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_tokens": 16}
    alone = text_of(await collect(backend, "hello", seeded))
    crowded = await asyncio.gather(
        collect(backend, "hello", seeded),
        *(collect(backend, p, {"temperature": 1.0, "max_tokens": 16}) for p in PROMPTS),
        collect(backend, "hello", seeded),
    )
    assert text_of(crowded[0]) == text_of(crowded[-1]) == alone
    other = text_of(await collect(backend, "hello", {**seeded, "seed": 99}))
    assert other != alone


async def wait_idle(backend: GenerativeBackend) -> int:
    """The running sequences once the engine's next steps have run (bounded wait, no timing)."""
    for _ in range(200):
        if backend.engine_stats().running == 0:
            return 0
        await asyncio.sleep(0.02)
    return backend.engine_stats().running


async def test_closing_the_stream_frees_the_sequence(backend: GenerativeBackend) -> None:
    stream = backend.stream("c", text_input("hello"), {"max_tokens": 400, "ignore_eos": True})
    await stream.__anext__()  # type: ignore[attr-defined]
    assert backend.engine_stats().running == 1
    assert backend.engine_stats().kv_cache_usage > 0
    await stream.aclose()  # type: ignore[attr-defined]
    assert await wait_idle(backend) == 0
    assert backend.engine_stats().kv_cache_usage == 0


async def test_an_idle_engine_uses_no_kv_cache_after_long_prompts(
    backend: GenerativeBackend,
) -> None:
    # Prompts longer than a page (64 tokens) leave complete blocks that transformers keeps for
    # prefix matches once their sequence ends: cached, free to evict, not in use (issue 37:
    # they were counted as used, so an idle server read 0.63 after a bench).
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 10)  # ~240 tokens
    await asyncio.gather(*(collect(backend, f"{i} {long}", GREEDY) for i in range(3)))
    assert await wait_idle(backend) == 0
    stats = backend.engine_stats()
    assert stats.kv_cache_usage == 0
    assert stats.kv_cache_cached > 0
    # A prompt that shares the prefix takes its blocks back from the cache while it runs.
    held = {"max_tokens": 250, "ignore_eos": True}  # within the context of 512 tokens
    before = backend.engine_stats()
    stream = backend.stream("p", text_input(f"0 {long}"), held)
    await stream.__anext__()  # type: ignore[attr-defined]
    during = backend.engine_stats()
    assert during.kv_cache_usage > 0
    # The lookups are counted as vLLM counts them (vllm:prefix_cache_queries and _hits): the
    # prompt's tokens looked up, and whole pages of them found.
    assert before.prefix_cache_queries is not None and before.prefix_cache_hits is not None
    assert during.prefix_cache_queries is not None and during.prefix_cache_hits is not None
    assert during.prefix_cache_queries > before.prefix_cache_queries
    found = during.prefix_cache_hits - before.prefix_cache_hits
    assert found >= 64 and found % 64 == 0
    await stream.aclose()  # type: ignore[attr-defined]
    assert await wait_idle(backend) == 0
    assert backend.engine_stats().kv_cache_usage == 0


async def test_a_stop_string_ends_the_answer_before_it(
    backend: GenerativeBackend, folder: Path
) -> None:
    want, _ = reference(folder, PROMPTS[0], 24)
    stop = want[10:14]
    parts = await collect(backend, PROMPTS[0], {**GREEDY, "stop": [stop, "never seen"]})
    assert text_of(parts) == want[: want.index(stop)]
    assert last(parts, "finish_reason") == "stop"
    assert await wait_idle(backend) == 0


async def test_chat_messages_go_through_the_chat_template(
    backend: GenerativeBackend, folder: Path
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    parts = await collect(backend, json.dumps(messages), {"input_format": "chat", **GREEDY})
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert last(parts, "num_input_tokens") == len(
        tokenizer(rendered, add_special_tokens=False).input_ids
    )


def test_ignore_eos_leaves_only_max_tokens_to_end_a_sequence(backend: Any) -> None:
    engine = backend._engine
    assert prepare(engine, text_input("hi"), Sampling()).eos == list(engine.eos_ids) != []
    assert prepare(engine, text_input("hi"), Sampling(ignore_eos=True)).eos == []


BAD = [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"max_tokens": -5}, "max_tokens must be at least 1"),
    ({"max_tokens": 1.5}, "max_tokens must be an integer"),
    (
        {"max_tokens": 510},
        r"maximum context length is 512 tokens\. However, you requested 514 tokens "
        r"\(4 in the prompt, 510 in the completion\)",
    ),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": -1}, "seed"),
    ({"stop": ["x"] * 17}, "stop takes at most 16"),
    ({"input_format": "chat"}, "chat messages are not JSON"),
    ({"input_format": "xml"}, "input_format"),
    ({"sampling_parameters": "{not json"}, "sampling_parameters is not JSON"),
]


@pytest.mark.parametrize(("parameters", "reason"), BAD)
async def test_bad_settings_are_refused_and_lose_nothing_else(
    backend: GenerativeBackend, parameters: dict[str, Any], reason: str
) -> None:
    beside = asyncio.create_task(collect(backend, "hello", GREEDY))
    with pytest.raises(InvalidInput, match=reason):
        await collect(backend, "hi there", parameters)
    assert last(await beside, "num_output_tokens") == 24


async def test_too_long_a_prompt_names_its_length(backend: GenerativeBackend) -> None:
    with pytest.raises(
        InvalidInput, match=r"maximum context length is 512 tokens\. However, you requested \d{3,} "
    ):
        await collect(backend, " the" * 600, {"max_tokens": 1})


async def test_a_request_without_one_prompt_is_refused(backend: GenerativeBackend) -> None:
    two = {"text_input": np.array([b"a", b"b"], dtype=object)}
    with pytest.raises(InvalidInput, match="one text_input"):
        _ = [p async for p in backend.stream("r", two, {})]


async def test_infer_joins_the_stream(backend: Any) -> None:
    # `infer` takes no parameters, so it draws with the contract's defaults: temperature 1,
    # no seed, at most 16 tokens. A draw may pick an end-of-sequence token before the 16th
    # (about 1 in 150 here, whatever ran before): it then ends with "stop", and only a draw of
    # all 16 may end with "length". Draws are repeated until one reaches the default bound.
    prompt = len(backend._engine.tokenizer("hello").input_ids)
    counts: list[int] = []
    while len(counts) < 8 and MAX_TOKENS_DEFAULT not in counts:
        outputs = await asyncio.to_thread(backend.infer, text_input("hello"))
        assert {len(a) for a in outputs.values()} == {1}  # one answer, its text joined
        assert int(outputs["num_input_tokens"][0]) == prompt
        count = int(outputs["num_output_tokens"][0])
        counts.append(count)
        reason = outputs["finish_reason"][0]
        if count == MAX_TOKENS_DEFAULT:  # the default bound reached (its last token may be EOS)
            assert reason in (b"length", b"stop"), reason
        else:  # an early end: only an end-of-sequence token after at least one token
            assert (count > 0, reason) == (True, b"stop"), (count, reason)
            assert count < MAX_TOKENS_DEFAULT, f"{count} tokens, beyond the default bound"
    assert counts[-1] == MAX_TOKENS_DEFAULT, counts


def test_cpu_runs_fp32_and_unknown_options_are_refused(backend: Any, folder: Path) -> None:
    import torch

    assert backend._engine.model.dtype == torch.float32
    with pytest.raises(ConfigError, match="unknown backend_options"):
        create_backend("transformers", folder / "config.json", BackendOptions(extra={"kv": 1}))
    with pytest.raises(ConfigError, match="kv_cache_gib must be a positive"):
        create_backend(
            "transformers", folder / "config.json", BackendOptions(extra={"kv_cache_gib": 0})
        )


async def test_unload_frees_the_engine(backend: GenerativeBackend) -> None:
    # Last in the module: it unloads the module's engine (the fixture's unload is then a no-op).
    stream = backend.stream("u", text_input("hello"), {"max_tokens": 400, "ignore_eos": True})
    await stream.__anext__()  # type: ignore[attr-defined]
    await asyncio.to_thread(backend.unload)
    # The running sequence ends with an error instead of hanging on a stopped engine.
    with pytest.raises(BackendError, match="stopped"):
        async for _ in stream:
            pass
    assert backend.engine_stats().running == 0
    with pytest.raises(Unavailable, match="not loaded"):
        await collect(backend, "hello", GREEDY)


def test_a_folder_transformers_cannot_read_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": "many"}')
    broken = create_backend("transformers", tmp_path / "config.json", BackendOptions())
    with pytest.raises(ConfigError, match="cannot load"):
        broken.load()
