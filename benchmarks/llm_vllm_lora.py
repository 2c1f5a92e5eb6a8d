"""LoRA adapters on the vLLM backend: N adapters of one base, mixed, against the base alone.

    .venv-vllm/bin/python -m benchmarks.llm_vllm_lora [--model llama-small] [--lora 8]
        [--requests 24] [--concurrency 8] [--rounds 5]

The vLLM counterpart of `benchmarks.llm_transformers --lora N` (issue 36; run it with the
interpreter that has the [vllm] extra). One serving core in this process (a ModelManager and
the DataPlane's stream path, no network) holds three vLLM engines built from the same folder with
the same engine arguments: `<model>-alone`, the base as served without adapters (LoRA off),
`<model>-eager`, the same without torch.compile (vLLM's CPU build compiles no LoRA engine), and
`<model>` with `enable_lora` and the zoo's N adapters of it (`<model>-lora-1..N`). All stay
loaded (an engine's process waits idle while another is measured: each starts once, not once
per run). Each round runs the arms back to back, their order turning round by round:
**base alone**, **base alone, eager**, **base, LoRA on** (requests to `<model>`: on vLLM's CPU
build they name a zero adapter, vllm.py) and **N adapters mixed** (the same requests, request
i to adapter i mod N: every step mixes adapters). Greedy, seeded prompts of 32-128 tokens,
outputs log-uniform in 8..--max-output (ignore_eos), C streams in flight.

Reported per arm: output tokens/s (wall) and output tokens per CPU second of this process and
its children (the engines' processes: where vLLM computes), medians over rounds, and the paired
ratio to the base alone (same round). Target: adapters mixed at least 0.8x the base alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
from transformers import AutoTokenizer

from benchmarks.harness.servers import RESULTS, WORK, cpu_seconds
from benchmarks.harness.statistics import machine
from benchmarks.harness.token_streams import stream_exactly
from dlscale.models.repository import ModelRepository
from dlscale.models.zoo import DECODERS
from dlscale.models.zoo.decoder_tokenizer import corpus
from dlscale.models.zoo.lora import adapters_of
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

#: The engine arguments of benchmarks/llm_vllm.py, for both engines.
ENGINE = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 16, "kv_cache_gib": 1}
ALONE, EAGER, LORA_ON, MIXED = "base alone", "base alone, eager", "base, LoRA on", "adapters mixed"
Request = tuple[str, int]  # (prompt, output tokens)


def build(model: str, count: int) -> tuple[Path, list[str]]:
    """The repository: the base three times on one folder (alone; alone without torch.compile;
    with LoRA on) and its adapters (of the LoRA-on one, which keeps the base's name)."""
    repo = WORK / "llm-vllm-lora-repo"
    adapters = adapters_of(model, count)
    if not (repo / model / "1" / "config.json").is_file():
        DECODERS[model].build(repo)
    for adapter in adapters:
        if not (repo / adapter.name / "config.toml").is_file():
            adapter.build(repo)
    lora = {"enable_lora": True, "max_loras": count, "max_lora_rank": 8}
    _config(repo, model, model, {**ENGINE, **lora})
    _config(repo, model, f"{model}-alone", ENGINE)
    # vLLM's CPU build runs a LoRA engine eagerly (it compiles none): what that costs alone.
    _config(repo, model, f"{model}-eager", {**ENGINE, "enforce_eager": True})
    return repo, [a.name for a in adapters]


def _config(repo: Path, model: str, name: str, options: dict[str, Any]) -> None:
    """`name`: the folder of `model` (its files linked) served with `options`."""
    if name != model:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        for item in (repo / model / "1").iterdir():
            if not (repo / name / "1" / item.name).exists():
                (repo / name / "1" / item.name).symlink_to(item.resolve())
    config = {"name": name, "backend": "vllm", "backend_options": options}
    (repo / name / "config.toml").write_text(tomli_w.dumps(config))


def workload(folder: Path, count: int, high: int, seed: int = 0) -> list[Request]:
    """Seeded prompts of 32-128 tokens and output lengths log-uniform in [8, high]."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(seed)
    ids = tokenizer(" ".join(corpus(256 * count, seed + 1)), add_special_tokens=False).input_ids
    requests, start = [], 0
    for _ in range(count):
        length = rng.randint(32, 128)
        prompt = tokenizer.decode(ids[start : start + length])
        start += length
        requests.append((prompt, round(math.exp(rng.uniform(math.log(8), math.log(high))))))
    return requests


async def run_arm(
    plane: DataPlane, models: list[str], requests: list[Request], inflight: int, side: str
) -> dict[str, Any]:
    """The requests through the stream path, `inflight` at a time, request i to models[i % n]."""
    slots = asyncio.Semaphore(inflight)
    counted: list[int] = []
    tpot: list[float] = []

    async def one(index: int, prompt: str, n: int) -> None:
        async with slots:
            times, last = await stream_exactly(plane, models[index % len(models)], index, prompt, n)
            counted.append(last)
            if last > 1:
                tpot.append((times[-1] - times[0]) / (last - 1))

    cpu, start = cpu_seconds(os.getpid()), time.perf_counter()
    await asyncio.gather(*(one(i, p, n) for i, (p, n) in enumerate(requests)))
    wall, cpu = time.perf_counter() - start, cpu_seconds(os.getpid()) - cpu
    tokens = sum(counted)
    if tokens != sum(n for _, n in requests):
        raise RuntimeError(f"{side}: the engine made {tokens} tokens, not the workload's")
    return {
        "side": side,
        "tokens": tokens,
        "seconds": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
        "tpot_p50_ms": round(float(np.percentile(tpot, 50)) * 1e3, 2),
        "load_1m": os.getloadavg()[0],
    }


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The engines loaded once; the arms' order turns round by round."""
    repo, adapters = build(args.model, args.lora)
    requests = workload(repo / args.model / "1", args.requests, args.max_output)
    manager = ModelManager(ModelRepository(repo))
    arms = {
        ALONE: [f"{args.model}-alone"],
        EAGER: [f"{args.model}-eager"],
        LORA_ON: [args.model],
        MIXED: adapters,
    }
    try:
        for name in (f"{args.model}-alone", f"{args.model}-eager", args.model, *adapters):
            await manager.load(name)
        plane = DataPlane(manager)
        for side, models in arms.items():  # warm-up: each adapter's first use reads it
            await run_arm(plane, models, requests[: len(adapters)], args.concurrency, side)
        rows, order = [], list(arms)
        for i in range(args.rounds):
            for side in order[i % len(order) :] + order[: i % len(order)]:
                row = await run_arm(plane, arms[side], requests, args.concurrency, side)
                rows.append({"round": i, **row})
                print("  " + json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        await manager.close()


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per arm and the paired ratios to the base alone (the same round)."""
    figures = ("tokens_per_s", "tokens_per_cpu_s", "tpot_p50_ms", "load_1m")
    sides = list(dict.fromkeys(r["side"] for r in rows))
    medians = {
        side: {f: statistics.median(r[f] for r in rows if r["side"] == side) for f in figures}
        for side in sides
    }
    pairs = [{r["side"]: r for r in rows if r["round"] == i} for i in {r["round"] for r in rows}]
    paired = {
        side: {
            f: [round(p[side][f] / p[ALONE][f], 3) for p in pairs]
            for f in ("tokens_per_s", "tokens_per_cpu_s")
        }
        for side in sides
    }
    median_paired = {
        side: {f: statistics.median(v) for f, v in by.items()} for side, by in paired.items()
    }
    return {
        "medians": medians,
        "paired": paired,
        "median_paired": median_paired,
        "target_met": median_paired[MIXED]["tokens_per_cpu_s"] >= 0.8,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="llama-small", choices=sorted(DECODERS))
    p.add_argument("--lora", type=int, default=8)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rows = asyncio.run(measure(args))
    result = summary(rows)
    print(json.dumps(result, indent=2))
    verdict = "met" if result["target_met"] else "MISSED"
    print(f"target (adapters mixed >= 0.8x the base alone, tokens per CPU s): {verdict}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"llm_vllm_lora-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {"args": vars(args), "engine": ENGINE, "rows": rows, **result, "machine": machine()}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
