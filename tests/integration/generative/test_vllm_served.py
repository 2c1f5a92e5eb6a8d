"""vLLM models served by a real server, asked with the real tritonclient (make test-vllm): a
dlscale config.toml and a Triton vLLM-backend repository (config.pbtxt, model.json)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

pytest.importorskip("vllm", reason="the vLLM backend needs the [vllm] extra: make test-vllm")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tritonclient_http = pytest.importorskip("tritonclient.http")

from tests.toolkit.server import LocalServer, serving  # noqa: E402

from dlscale.models.zoo.decoder import LLAMA_TINY  # noqa: E402

pytestmark = pytest.mark.vllm

ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25, "enforce_eager": True}
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm_repo")
    folder = LLAMA_TINY.build(root)
    config = {
        "name": folder.name,
        "backend": "vllm",
        # Two sequences at once: the others wait for a seat in the server's queue.
        "backend_options": {**ENGINE, "max_num_seqs": 2},
    }
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    triton = root / "triton-llama"
    shutil.copytree(folder / "1", triton / "weights")
    (triton / "1").mkdir()
    # model.json holds vLLM's own engine arguments (kv_cache_gib is dlscale's spelling).
    engine = {**ENGINE, "kv_cache_memory_bytes": 2**28}
    del engine["kv_cache_gib"]
    (triton / "1" / "model.json").write_text(json.dumps({"model": "../weights", **engine}))
    (triton / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [{ count: 1, kind: KIND_MODEL }]\n'
        "model_transaction_policy { decoupled: true }\n"
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


def ask(server: LocalServer, model: str, prompt: str, **parameters: Any) -> dict[str, Any]:
    client = tritonclient_http.InferenceServerClient(server.http_url, network_timeout=120)
    text = tritonclient_http.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    result = client.infer(model, [text], parameters=parameters)
    return {
        "text": bytes(result.as_numpy("text_output")[0]).decode(),
        "tokens": int(result.as_numpy("num_output_tokens")[0]),
        "reason": bytes(result.as_numpy("finish_reason")[0]).decode(),
    }


def test_a_unary_request_gets_the_greedy_answer_of_transformers(
    server: LocalServer, repo: Path
) -> None:
    folder = repo / "llama-tiny" / "1"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer(PROMPT).input_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    expected = [int(t) for t in out[0, len(ids) :]]
    answer = ask(server, "llama-tiny", PROMPT, max_tokens=20, temperature=0)
    assert answer["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert answer["tokens"] == len(expected)


def test_the_triton_repository_serves_the_same_weights_alike(server: LocalServer) -> None:
    settings = {"max_tokens": 16, "temperature": 0}
    ours = ask(server, "llama-tiny", PROMPT, **settings)
    # Triton's vLLM clients pack their sampling settings in one JSON string.
    packed = {"sampling_parameters": json.dumps(settings)}
    assert ask(server, "triton-llama", PROMPT, **packed) == ours


def test_more_requests_than_sequences_queue_and_are_all_answered(server: LocalServer) -> None:
    prompts = [f"{PROMPT} {i}" for i in range(6)]
    alone = [ask(server, "llama-tiny", p, max_tokens=12, temperature=0) for p in prompts[:2]]
    with ThreadPoolExecutor(6) as pool:
        together = list(
            pool.map(lambda p: ask(server, "llama-tiny", p, max_tokens=12, temperature=0), prompts)
        )
    assert together[:2] == alone
    assert all(a["tokens"] >= 1 for a in together)


def test_too_long_a_prompt_is_a_400_naming_the_context(server: LocalServer) -> None:
    with pytest.raises(tritonclient_http.InferenceServerException) as caught:
        ask(server, "llama-tiny", "word " * 300)
    assert caught.value.status() == "400"
    assert "maximum context length is 256 tokens" in caught.value.message()
    assert ask(server, "llama-tiny", PROMPT, max_tokens=2, ignore_eos=True)["tokens"] == 2
