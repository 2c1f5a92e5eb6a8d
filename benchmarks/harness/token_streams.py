"""One generative request through the serving core's stream path, timed token by token: the
in-process LLM benchmarks (llm_transformers, llm_vllm_lora) each send their workload this way."""

from __future__ import annotations

import time

import numpy as np

from dlscale.serving.dataplane import DataPlane
from dlscale.types import InferenceRequest


async def stream_exactly(
    plane: DataPlane, model: str, index: int, prompt: str, tokens: int
) -> tuple[list[float], int]:
    """Ask `model` for exactly `tokens` greedy tokens after `prompt` (EOS ignored, so every arm
    makes the same work); the perf_counter time of each answer that counted tokens, and the
    last count."""
    request = InferenceRequest(
        model,
        {"text_input": np.array([prompt.encode()], dtype=object)},
        id=str(index),
        parameters={"max_tokens": tokens, "ignore_eos": True, "temperature": 0.0},
    )
    times, last = [], 0
    async for response in plane.stream(request):
        if "num_output_tokens" in response.outputs:
            times.append(time.perf_counter())
            last = int(response.outputs["num_output_tokens"][0])
    return times, last
