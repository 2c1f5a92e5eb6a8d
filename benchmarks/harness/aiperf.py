"""NVIDIA's aiperf (PyPI 0.13.0) in its own venv, run on an endpoint, its figures read back.

`ensure_aiperf()` installs it under .bench/aiperf-venv once. `run_aiperf` runs `aiperf profile`
with the load dlscale's generative bench offers (concurrency, ISL/OSL, request count, warm-up,
the model's tokenizer folder offline, the server's own token counts) and returns the figures
the two benches share, from aiperf's `profile_export_aiperf.json`. aiperf's "inter token
latency" is (request latency - TTFT) / (output tokens - 1) per request: dlscale's TPOT
(shared/reference/generative.md).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENV = Path(".bench/aiperf-venv")
AIPERF_VERSION = "0.13.0"
#: aiperf's endpoint types, by dlscale's --generative names.
ENDPOINT_TYPES = {"openai": "completions", "completions": "completions", "chat": "chat"}


def ensure_aiperf(venv: Path = VENV) -> Path:
    """The `aiperf` executable, installed into its own venv the first time."""
    exe = venv / "bin" / "aiperf"
    if exe.is_file():
        return exe
    print(f"installing aiperf {AIPERF_VERSION} into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"aiperf=={AIPERF_VERSION}"], check=True)
    return exe


@dataclass(frozen=True)
class TokenLoad:
    """The load both benches offer: one endpoint, one concurrency, fixed ISL and OSL."""

    url: str
    kind: str
    model: str
    tokenizer: Path
    concurrency: int
    isl: int
    osl: int
    requests: int
    warmup: int = 2
    ignore_eos: bool = True
    seed: int = 0


def aiperf_argv(exe: Path, load: TokenLoad, out: Path) -> list[str]:
    """`aiperf profile` for `load`, its artifacts into `out`, quiet and offline."""
    host = load.url.split("://", 1)[-1]
    argv = [str(exe), "profile", "--model", load.model, "--url", host]
    argv += ["--endpoint-type", ENDPOINT_TYPES[load.kind], "--streaming"]
    argv += ["--concurrency", str(load.concurrency), "--request-count", str(load.requests)]
    argv += ["--isl", str(load.isl), "--osl", str(load.osl)]
    argv += ["--tokenizer", str(load.tokenizer), "--use-server-token-count"]
    argv += ["--warmup-request-count", str(load.warmup), "--random-seed", str(load.seed)]
    # One worker and one record processor: on a small host its own processes share the cores.
    argv += ["--workers-max", "1", "--record-processors", "1"]
    argv += ["--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none"]
    argv += ["--artifact-dir", str(out)]
    if load.ignore_eos:
        argv += ["--extra-inputs", "ignore_eos:true"]
    return argv


def run_aiperf(load: TokenLoad, out: Path, venv: Path = VENV) -> dict[str, Any]:
    """Run aiperf once; its TTFT, ITL (TPOT), latency (seconds) and throughputs."""
    exe = ensure_aiperf(venv)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "aiperf.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as f:
        done = subprocess.run(aiperf_argv(exe, load, out), stdout=f, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf failed ({done.returncode}); see {log}")
    doc = json.loads((out / "profile_export_aiperf.json").read_text())

    def ms(key: str, stat: str) -> float | None:
        value = doc.get(key, {}).get(stat)
        return value / 1e3 if value is not None else None

    return {
        "ttft_p50_s": ms("time_to_first_token", "p50"),
        "ttft_p99_s": ms("time_to_first_token", "p99"),
        "ttft_mean_s": ms("time_to_first_token", "avg"),
        "tpot_p50_s": ms("inter_token_latency", "p50"),
        "tpot_mean_s": ms("inter_token_latency", "avg"),
        "latency_p50_s": ms("request_latency", "p50"),
        "output_tokens_per_s": doc["output_token_throughput"]["avg"],
        "requests_per_s": doc["request_throughput"]["avg"],
        "output_tokens": doc.get("total_output_tokens", {}).get("avg"),
        "requests": doc.get("request_count", {}).get("avg"),
        # The CPU its processes used, start-up included: on a small host the server's loss.
        "client_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


def aiperf_version(venv: Path = VENV) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import aiperf; print(aiperf.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or AIPERF_VERSION
