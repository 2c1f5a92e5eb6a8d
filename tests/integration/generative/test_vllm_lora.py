"""LoRA adapters on a vLLM base, served by a real server and asked with tritonclient (make
test-vllm): each adapter answers as its weights merged into the base answer with transformers'
`generate`, mixed concurrent requests each get their solo answer, and a pickle beside an
adapter is refused (403) by the same rules as on the transformers engine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tomli_w

pytest.importorskip("vllm", reason="the vLLM backend needs the [vllm] extra: make test-vllm")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
tritonclient_http = pytest.importorskip("tritonclient.http")

from tests.toolkit.server import LocalServer, serving  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from dlscale.models.zoo.decoder import LLAMA_TINY  # noqa: E402
from dlscale.models.zoo.lora import adapters_of  # noqa: E402

pytestmark = pytest.mark.vllm

ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25, "enforce_eager": True}
LORA = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
PROMPTS = ("the quick brown fox", "GPU memory")
MAX_TOKENS = 12
#: merged_answer's name for the base model alone.
BASE_ONLY = ""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm_lora_repo")
    folder = LLAMA_TINY.build(root)
    config = {"name": folder.name, "backend": "vllm", "backend_options": {**ENGINE, **LORA}}
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    for adapter in adapters_of(LLAMA_TINY.name, 2):
        adapter.build(root)
    pickled = root / "with-pickle"
    shutil.copytree(root / "llama-tiny-lora-1", pickled)
    (pickled / "config.toml").write_text(
        'name = "with-pickle"\nbackend = "lora"\nbase = "llama-tiny"\n'
    )
    (pickled / "1" / "adapter_model.bin").write_bytes(b"\x80\x04K.")
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    names = ("llama-tiny", "llama-tiny-lora-1", "llama-tiny-lora-2")
    with serving(repo, load_models=names) as running:
        yield running


def ask(server: LocalServer, model: str, prompt: str) -> str:
    client = tritonclient_http.InferenceServerClient(server.http_url, network_timeout=120)
    text = tritonclient_http.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    result = client.infer(model, [text], parameters={"temperature": 0.0, "max_tokens": MAX_TOKENS})
    return bytes(result.as_numpy("text_output")[0]).decode()


def merged_answer(repo: Path, adapter: str, prompt: str) -> str:
    """transformers' greedy `generate` with the adapter's B A scale added to each weight
    (BASE_ONLY: the base's own answer, nothing added)."""
    scale_of = 0.0 if adapter == BASE_ONLY else 1.0
    adapter = "llama-tiny-lora-1" if adapter == BASE_ONLY else adapter
    folder = repo / "llama-tiny" / "1"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    peft = json.loads((repo / adapter / "1" / "adapter_config.json").read_text())
    tensors = safetensors_torch.load_file(str(repo / adapter / "1" / "adapter_model.safetensors"))
    scale = scale_of * peft["lora_alpha"] / peft["r"]
    with torch.no_grad():
        for key, a in tensors.items():
            if ".lora_A." in key:
                module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = tensors[key.replace("lora_A", "lora_B")]
                model.get_submodule(module).weight += scale * (b @ a)
    ids = tokenizer(prompt, return_tensors="pt")
    new = model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0]
    return str(tokenizer.decode(new[ids.input_ids.shape[1] :], skip_special_tokens=True))


def test_adapters_answer_as_their_merged_weights_and_apart_in_mixed_requests(
    server: LocalServer, repo: Path
) -> None:
    models = ("llama-tiny", "llama-tiny-lora-1", "llama-tiny-lora-2")
    solo = {(m, p): ask(server, m, p) for m in models for p in PROMPTS}
    for prompt in PROMPTS:
        assert len({solo[(m, prompt)] for m in models}) == 3
        assert solo[("llama-tiny-lora-1", prompt)] == merged_answer(
            repo, "llama-tiny-lora-1", prompt
        )
        # Base requests name a zero adapter on vLLM's CPU build (vllm.py): still the base's.
        assert solo[("llama-tiny", prompt)] == merged_answer(repo, BASE_ONLY, prompt)
    asks = [(m, p) for p in PROMPTS for m in models] * 2
    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda a: ask(server, *a), asks))
    wrong = [(a, x, solo[a]) for a, x in zip(asks, answers, strict=True) if x != solo[a]]
    assert not wrong, wrong


def test_a_pickle_beside_an_adapter_is_refused(server: LocalServer) -> None:
    client = tritonclient_http.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match=r"adapter_model\.bin") as refused:
        client.load_model("with-pickle")
    assert refused.value.status() == "403"
    assert ask(server, "llama-tiny-lora-2", PROMPTS[0])  # the server serves on
