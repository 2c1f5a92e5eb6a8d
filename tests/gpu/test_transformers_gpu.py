"""The transformers backend on a CUDA GPU: FP32 greedy equal to `generate`, BF16 by default,
and the ~1B zoo decoder streaming under concurrency with its KV cache sized from free memory.

Run on a GPU machine with `make test-gpu` (docs/testing.md); skipped elsewhere, saying what is
missing. Written and run on the CPU path only so far: these await a GPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.toolkit.gpu import torch_cuda_missing

transformers = pytest.importorskip("transformers")

from dlscale.backends import BackendOptions, create_backend  # noqa: E402
from dlscale.backends.generative.contract import GenerativeBackend  # noqa: E402
from dlscale.models.zoo import build_zoo  # noqa: E402

NO_CUDA = torch_cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA is not None, reason=str(NO_CUDA))]
PROMPTS = ("Hello world, tell me a story", "the cat", "GPU memory and the cache", "a")


def loaded(folder: Path, **extra: Any) -> GenerativeBackend:
    backend = create_backend(
        "transformers", folder / "config.json", BackendOptions(device="cuda:0", extra=extra)
    )
    backend.load()
    assert isinstance(backend, GenerativeBackend)
    return backend


async def answer(backend: GenerativeBackend, prompt: str, parameters: Mapping[str, Any]) -> Any:
    inputs = {"text_input": np.array([prompt.encode()], dtype=object)}
    parts = [p async for p in backend.stream("g", inputs, parameters)]
    text = "".join(bytes(p.outputs["text_output"][0]).decode() for p in parts)
    return text, int(parts[-1].outputs["num_output_tokens"][0])


def test_fp32_greedy_equals_generate_on_the_gpu(tmp_path: Path) -> None:
    folder = build_zoo(tmp_path, ["llama-tiny"])[0] / "1"
    backend = loaded(folder, dtype="float32", kv_cache_gib=0.25)
    try:
        greedy = {"temperature": 0.0, "max_tokens": 24}
        got = asyncio.run(_all(backend, greedy))
    finally:
        backend.unload()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).to("cuda:0")
    for prompt, (text, _) in zip(PROMPTS, got, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").to("cuda:0")
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)[0]
        want = tokenizer.decode(out[ids.input_ids.shape[1] :], skip_special_tokens=True)
        assert text == want, prompt


async def _all(backend: GenerativeBackend, parameters: Mapping[str, Any]) -> list[Any]:
    return await asyncio.gather(*(answer(backend, p, parameters) for p in PROMPTS))


def test_the_1b_decoder_runs_bf16_with_its_cache_from_free_memory(tmp_path: Path) -> None:
    folder = build_zoo(tmp_path, ["llama-1b"])[0] / "1"
    backend = loaded(folder)
    try:
        assert (
            backend._engine.model.dtype
            == transformers.AutoConfig.from_pretrained(  # type: ignore[attr-defined]
                folder
            ).dtype
        )
        settings = {"max_tokens": 64, "ignore_eos": True, "temperature": 0.7, "seed": 1}
        got = asyncio.run(_all(backend, settings))
        assert [n for _, n in got] == [64] * len(PROMPTS)
        assert backend.engine_stats().running == 0
    finally:
        backend.unload()


def test_the_row_processors_run_on_the_gpu(tmp_path: Path) -> None:
    """Logprobs, a repetition penalty, min_tokens and a JSON-schema grammar read each row's
    Python state at every step: on CUDA tensors too (written on the CPU path, awaits a GPU)."""
    import json

    from dlscale.sampling import Guide, Sampling

    folder = build_zoo(tmp_path, ["llama-tiny"])[0] / "1"
    backend = loaded(folder, dtype="float32", kv_cache_gib=0.25)
    schema = (
        '{"type": "object", "properties": {"c": {"enum": ["red", "green"]}}, "required": ["c"]}'
    )
    typed = Sampling(
        max_tokens=24,
        temperature=0.0,
        logprobs=2,
        repetition_penalty=1.3,
        min_tokens=2,
        guide=Guide("json_schema", schema),
    )
    inputs = {"text_input": np.array([b"Hello"], dtype=object)}

    async def run() -> list[Any]:
        return [p async for p in backend.generate("g", inputs, typed)]

    try:
        parts = asyncio.run(run())
    finally:
        backend.unload()
    text = "".join(bytes(p.outputs["text_output"][0]).decode() for p in parts)
    assert json.loads(text)["c"] in ("red", "green")
    rows = [r for p in parts for r in json.loads(str(p.parameters.get("logprobs", "[]")))]
    assert rows and all(len(top) == 2 and lp <= 0 for _, lp, top in rows)
