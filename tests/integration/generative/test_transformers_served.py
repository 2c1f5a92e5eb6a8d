"""The zoo's llama-tiny on the transformers backend, served: OIP infer over REST and gRPC with
the real tritonclient (a generative model's infer joins its stream), greedy equal to
transformers' `generate`, bad settings refused with the reason and nothing else lost."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

from tests.toolkit.server import LocalServer, serving  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from dlscale.models.zoo import build_zoo  # noqa: E402

MODEL = "llama-tiny"
PROMPTS = ("Hello world, tell me a story", "the cat", "GPU memory and the cache", "a")
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm_repo")
    build_zoo(root, [MODEL])
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


def reference(folder: Path, prompts: tuple[str, ...]) -> list[tuple[str, int]]:
    """transformers' own greedy `generate` on the same weights: (text, tokens) per prompt."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return [_generate(tokenizer, model, prompt) for prompt in prompts]


def _generate(tokenizer: Any, model: Any, prompt: str) -> tuple[str, int]:
    ids = tokenizer(prompt, return_tensors="pt")
    new = model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0][
        ids.input_ids.shape[1] :
    ]
    return tokenizer.decode(new, skip_special_tokens=True), len(new)


def http_infer(server: LocalServer, prompt: str, parameters: dict[str, Any]) -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    return client.infer(MODEL, [text], parameters=parameters)


def test_rest_greedy_answers_equal_generate_under_concurrency(
    server: LocalServer, repo: Path
) -> None:
    greedy = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda p: http_infer(server, p, greedy), PROMPTS))
    for answer, (text, tokens) in zip(answers, reference(repo / MODEL / "1", PROMPTS), strict=True):
        assert answer.as_numpy("text_output")[0].decode() == text
        assert int(answer.as_numpy("num_output_tokens")[0]) == tokens
        assert answer.as_numpy("finish_reason")[0] in (b"length", b"stop")


def test_grpc_infer_with_a_seed_repeats(server: LocalServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello"], dtype=object))
    seeded = {"temperature": 0.8, "seed": 7, "max_tokens": 12}
    first, second = (
        client.infer(MODEL, [text], parameters=seeded).as_numpy("text_output")[0] for _ in range(2)
    )
    assert first == second


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"max_tokens": -1}, "max_tokens must be at least 1"),
        ({"max_tokens": 100_000}, "maximum context length is 512 tokens"),
        ({"top_p": 0}, "top_p"),
    ],
)
def test_bad_settings_get_a_400_with_the_reason(
    server: LocalServer, parameters: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InferenceServerException, match=reason) as refused:
        http_infer(server, "hello", parameters)
    assert refused.value.status() == "400"
    # The model still answers.
    # Greedy: without a temperature the engine draws at 1 (the contract's default), and a draw may
    # end at its first token.
    greedy = {"max_tokens": 2, "temperature": 0}
    assert http_infer(server, "hello", greedy).as_numpy("num_output_tokens")[0] == 2
