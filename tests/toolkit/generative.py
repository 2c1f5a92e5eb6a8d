"""A generative model written in Python by the generative contract, for the OpenAI API's tests.

Its "tokens" are words: the prompt's words are its input tokens; each output token is a colour,
chosen by position when greedy and by a generator seeded with the request's seed otherwise, so
that a seed gives the same text again. Prompt words change its behaviour: `forever` generates
slowly until the client leaves (max_tokens permitting), `fail` fails after two tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import tritonclient.http as th
from tests.toolkit.python_models import write_python_model

from dlscale.wire.generative import signature_toml

#: Its context, in words (config [metadata] max_model_len says the same to /v1/models).
MAX_MODEL_LEN = 64
WORDS = ("red", "green", "blue", "cyan", "magenta", "yellow", "black", "white")

COLOURS = f"""
import time

import numpy as np

from dlscale.backends.generative.contract import Sampling, chat_messages, part, prompt_text
from dlscale.errors import InvalidInput

WORDS = {WORDS!r}
MAX_MODEL_LEN = {MAX_MODEL_LEN}


class Model:
    def stream(self, inputs, parameters):
        sampling = Sampling.from_parameters(parameters)
        text = prompt_text(inputs)
        if sampling.input_format == "chat":
            text = " ".join(m["content"] for m in chat_messages(text))
        prompt = text.split()
        if len(prompt) > MAX_MODEL_LEN:
            raise InvalidInput(
                f"the prompt has {{len(prompt)}} tokens, above max_model_len {{MAX_MODEL_LEN}}"
            )
        rng = np.random.default_rng(sampling.seed)
        said = ""
        for n in range(1, sampling.max_tokens + 1):
            if "fail" in prompt and n == 3:
                raise RuntimeError("the engine failed in the middle of a generation")
            if "forever" in prompt:
                time.sleep(0.01)
            index = (len(prompt) + n) % len(WORDS) if sampling.greedy else rng.integers(len(WORDS))
            word = WORDS[index] if n == 1 else " " + WORDS[index]
            whole = said + word
            hits = [whole.find(s) for s in sampling.stop if s in whole]
            if hits:  # the stop string is left out of the answer, as engines do
                yield part(whole[len(said) : min(hits)], len(prompt), n, "stop").outputs
                return
            said += word
            reason = "length" if n == sampling.max_tokens else None
            yield part(word, len(prompt), n, reason).outputs
"""

COLOURS_TOML = f"""
[backend_options]
max_num_seqs = 2
[batching]
priority_levels = 2
[metadata]
max_model_len = {MAX_MODEL_LEN}
""" + signature_toml()


def greedy_words(prompt: str, count: int) -> list[str]:
    """What the colours model answers a prompt greedily: `count` words."""
    length = len(prompt.split())
    return [WORDS[(length + n) % len(WORDS)] for n in range(1, count + 1)]


def write_colours(root: Path, name: str = "colours") -> Path:
    """REPO/<name>: the colours model (Python, in the server process)."""
    return write_python_model(root, name, COLOURS, COLOURS_TOML)


def outcomes(url: str, model: str, headers: dict[str, str] | None = None) -> tuple[int, int]:
    """(successes, failures) the server's statistics count for `model` (tritonclient; `headers`
    for a server with an API key)."""
    client = th.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model, headers=dict(headers or {}))
        stats = stats["model_stats"][0]["inference_stats"]
    finally:
        client.close()
    return int(stats["success"]["count"]), int(stats["fail"]["count"])


def next_outcome(
    url: str, model: str, before: tuple[int, int], headers: dict[str, str] | None = None
) -> tuple[int, int]:
    """The change in (successes, failures) once one more request of `model` is recorded (polled,
    up to 60 s: a request is recorded when its stream ends, however it ends)."""
    for _ in range(3000):
        now = outcomes(url, model, headers)
        if sum(now) > sum(before):
            return now[0] - before[0], now[1] - before[1]
        time.sleep(0.02)
    raise AssertionError(f"no request of {model} ended within 60 s")
