"""The vLLM backend's settings, without an engine: an argument vLLM lacks and a GPU instance on
the CPU build are ConfigErrors naming why; the typed Sampling maps to vLLM's SamplingParams
(make test-vllm). Apart from test_vllm_backend.py, whose module-wide event loop these
synchronous tests do not use."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM backend needs the [vllm] extra: make test-vllm")

from dlscale.backends.base import BackendOptions
from dlscale.backends.generative.vllm import VllmBackend
from dlscale.errors import ConfigError
from dlscale.models.zoo.decoder import LLAMA_TINY

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return LLAMA_TINY.build(tmp_path_factory.mktemp("vllm")) / "1"


def test_an_engine_argument_vllm_lacks_is_a_config_error(folder: Path, tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    shutil.copytree(folder, tmp_path / "m" / "weights")
    (version / "model.json").write_text(json.dumps({"model": "../weights", "no_such_arg": 1}))
    with pytest.raises(ConfigError, match="no_such_arg"):
        VllmBackend(version / "model.json", BackendOptions()).load()


def test_a_gpu_instance_on_the_cpu_build_is_refused_with_the_reason(folder: Path) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's GPU build serves cuda instances")
    with pytest.raises(ConfigError, match="CPU build"):
        VllmBackend(folder / "config.json", BackendOptions(device="cuda:0")).load()


def test_the_typed_settings_map_to_vllms_sampling_params() -> None:
    from dlscale.backends.generative.vllm import sampling_params
    from dlscale.sampling import Guide, Sampling

    typed = Sampling(
        max_tokens=9,
        top_k=3,
        min_tokens=2,
        repetition_penalty=1.3,
        logprobs=4,
        guide=Guide("json_schema", '{"type": "object"}'),
    )
    params = sampling_params(typed)
    assert (params.max_tokens, params.top_k, params.min_tokens) == (9, 3, 2)
    assert (params.repetition_penalty, params.logprobs) == (1.3, 4)
    guided = getattr(params, "structured_outputs", None) or params.guided_decoding
    assert guided.json == {"type": "object"}
    assert sampling_params(Sampling()).top_k in (0, -1)  # every token, in vLLM's words
