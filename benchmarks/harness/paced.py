"""A generative model that paces its tokens: a steady endpoint for comparing two clients.

A Python model by dlscale's generative contract: each output token is a word, sent `pace_ms`
after the previous one (after `first_ms` for the first), up to `max_tokens` (it never stops
early, so `ignore_eos` changes nothing). The server spends its time asleep, not computing, so
what a client measures depends on the client and the server's streaming path, not on how much
CPU the client leaves the model on a small host.
"""

from __future__ import annotations

from pathlib import Path

from dlscale.wire.generative import signature_toml

PACED = """
import time

from dlscale.backends.generative.contract import Sampling, chat_messages, part, prompt_text

FIRST_S = {first_s}
PACE_S = {pace_s}


class Model:
    def stream(self, inputs, parameters):
        sampling = Sampling.from_parameters(parameters)
        text = prompt_text(inputs)
        if sampling.input_format == "chat":
            text = " ".join(m["content"] for m in chat_messages(text))
        prompt = len(text.split())
        time.sleep(FIRST_S)
        for n in range(1, sampling.max_tokens + 1):
            if n > 1:
                time.sleep(PACE_S)
            reason = "length" if n == sampling.max_tokens else None
            yield part(" w" + str(n % 10), prompt, n, reason).outputs
"""

CONFIG = """backend = "python"
instances = [{{ count = {seqs}, device = "cpu" }}]
[backend_options]
max_num_seqs = {seqs}
[metadata]
max_model_len = 100000
""" + signature_toml()


def write_paced(root: Path, name: str = "paced", first_ms: float = 20.0, pace_ms: float = 10.0,
                seqs: int = 16) -> Path:  # fmt: skip
    """REPO/<name>: the paced model (Python, in the server process)."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    code = PACED.format(first_s=first_ms / 1e3, pace_s=pace_ms / 1e3)
    (folder / "1" / "model.py").write_text(code)
    (folder / "config.toml").write_text(CONFIG.format(seqs=seqs))
    return folder
