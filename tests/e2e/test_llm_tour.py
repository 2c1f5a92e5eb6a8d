"""The README's LLM tour as a user runs it: `dlscale serve` (the command) loads the zoo's
llama-tiny; the console holds the server's lines, and the libraries' load-time messages
(torchao's kernels, torch's pytree deprecations, the weight-loading bar) are in the model's log
file, which the console names."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

from tests.toolkit.cli import served

from dlscale.models.zoo import build_zoo

#: What a load printed before: torchao's, torch's pytree's, transformers' progress bar.
NOISE = ("torchao", "_pytree", "Loading weights")


def test_an_llm_load_keeps_third_party_noise_off_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_zoo(tmp_path / "models", ["llama-tiny"])
    logs = tmp_path / "logs"
    monkeypatch.setenv("DLSCALE_MODEL_LOG_DIR", str(logs))  # the child's environment
    with served(tmp_path / "models") as server:
        answer = httpx.post(
            f"http://{server.http_url}/v1/completions",
            json={"model": "llama-tiny", "prompt": "hello", "max_tokens": 2},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        console = server.log()
    assert not [n for n in NOISE if n in console], console
    model_log = logs / "llama-tiny.log"
    assert f"messages of the libraries its load used are in {model_log}" in console
    kept = model_log.read_text()
    assert "torchao" in kept and "_pytree" in kept, kept  # kept, not lost
