"""Continuous batching against static batching: the transformers backend and a `generate` loop.

    python -m benchmarks.llm_transformers [--model llama-small] [--requests 24]
        [--concurrency 4,8,16] [--repeats 3] [--threads 1] [--max-output 128] [--lora 8]

The zoo's decoder (built into --dir on first use), FP32 on the CPU, greedy, the same seeded
prompts (32 to 128 tokens) and output lengths (log-uniform from --min-output to --max-output,
reached exactly: ignore_eos) on both sides, alternating in each repetition:

- static: transformers' own `generate` over batches of C requests in order, padded
  on the left, each batch run until its longest output ends (what a server without continuous
  batching does); the steps are timed by a logits processor, which `generate` calls once a step;
- continuous: the transformers backend behind the serving core's stream path (DataPlane.stream:
  validation, seats, token metrics; no network), C requests in flight, a new one as
  each ends;

for each C of --concurrency. All requests arrive at the start (MLPerf's Offline scenario).
Reported: output tokens/s (each request's own tokens over the wall time), TPOT p50 and p99 and
TTFT p50 over the requests, medians over the repetitions, and the ratio of tokens/s.

`--lora N` measures LoRA adapters instead (issue 36): the base model alone against N of the
zoo's adapters of it served on one engine, the same requests spread over the adapters in turn
(`run_lora`); the ratio is against the base alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor

from benchmarks.harness.statistics import machine
from benchmarks.harness.token_streams import stream_exactly
from dlscale.models.repository import ModelRepository
from dlscale.models.zoo import build_zoo
from dlscale.models.zoo.decoder_tokenizer import corpus
from dlscale.models.zoo.lora import adapters_of
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

Request = tuple[str, int]  # (prompt, output tokens)
STATIC, CONTINUOUS = "static generate", "transformers backend"
BASE_ALONE, BASE_LORA_ON = "base alone", "base alone, LoRA on"


def workload(tokenizer: Any, count: int, low: int, high: int, seed: int = 0) -> list[Request]:
    """Seeded prompts of 32-128 tokens and output lengths log-uniform in [low, high]."""
    rng = random.Random(seed)
    text = " ".join(corpus(20 * count * 128 // 10, seed + 1))
    ids = tokenizer(text, add_special_tokens=False).input_ids
    requests, start = [], 0
    for _ in range(count):
        length = rng.randint(32, 128)
        prompt = tokenizer.decode(ids[start : start + length])
        start += length
        output = round(math.exp(rng.uniform(math.log(low), math.log(high))))
        requests.append((prompt, output))
    return requests


class _StepClock(LogitsProcessor):
    """Records when each generation step's logits are ready (one call per step)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.times.append(time.perf_counter())
        return scores


def run_static(folder: Path, requests: list[Request], batch: int) -> dict[str, Any]:
    """`generate` over fixed batches, each to its longest output; per-request TTFT and TPOT."""
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ttft, tpot, tokens = [], [], 0
    start, cpu = time.perf_counter(), time.process_time()
    for first in range(0, len(requests), batch):
        group = requests[first : first + batch]
        encoded = tokenizer([p for p, _ in group], return_tensors="pt", padding=True)
        longest = max(n for _, n in group)
        clock = _StepClock()
        with torch.inference_mode():
            model.generate(
                **encoded,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                logits_processor=[clock],
                pad_token_id=tokenizer.pad_token_id,
            )
        for _, n in group:
            tokens += n
            ttft.append(clock.times[0] - start)
            if n > 1:
                tpot.append((clock.times[n - 1] - clock.times[0]) / (n - 1))
    cpu = time.process_time() - cpu
    return _summary(STATIC, tokens, time.perf_counter() - start, ttft, tpot, cpu)


async def run_continuous(
    repo: Path,
    name: str,
    requests: list[Request],
    inflight: int,
    models: list[str] | None = None,
    side: str = CONTINUOUS,
) -> Any:
    """The transformers backend through DataPlane.stream, `inflight` requests at a time;
    with `models` (LoRA adapters of `name`), request i asks models[i % len(models)]."""
    manager = ModelManager(ModelRepository(repo))
    await manager.load(name)
    for model in models or ():
        await manager.load(model)
    asked = models or [name]
    plane = DataPlane(manager)
    slots = asyncio.Semaphore(inflight)
    ttft: list[float] = []
    tpot: list[float] = []
    counted: list[int] = []

    async def one(index: int, prompt: str, n: int) -> None:
        async with slots:
            times, last = await stream_exactly(plane, asked[index % len(asked)], index, prompt, n)
            counted.append(last)
            ttft.append(times[0] - start)
            if last > 1:
                tpot.append((times[-1] - times[0]) / (last - 1))

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i, p, n) for i, (p, n) in enumerate(requests)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await manager.close()
    if sum(counted) != sum(n for _, n in requests):
        raise RuntimeError(f"the engine made {sum(counted)} tokens, not the workload's")
    return _summary(side, sum(counted), elapsed, ttft, tpot, cpu)


def lora_repository(root: Path, model: str, count: int, threads: int) -> list[str]:
    """`root/lora/`: the model again (its weights linked) with enable_lora, and `count` of the
    zoo's adapters of it; their names."""
    repo = root / "lora"
    adapters = [a.name for a in adapters_of(model, count)]
    build_zoo(repo, [a for a in adapters if not (repo / a / "config.toml").exists()])
    (repo / model).mkdir(parents=True, exist_ok=True)
    if not (repo / model / "1").exists():
        (repo / model / "1").symlink_to((root / model / "1").resolve())
    settings = tomllib.loads((root / model / "config.toml").read_text())
    options = settings.setdefault("backend_options", {})
    options.update(enable_lora=True, max_loras=count, intra_op_threads=threads)
    (repo / model / "config.toml").write_text(tomli_w.dumps(settings))
    return adapters


def run_lora(args: argparse.Namespace, requests: list[Request]) -> None:
    """The LoRA arm: the base model alone (LoRA off, as served without adapters) against
    `--lora N` adapters of it on one engine, requests spread over them in turn, paired per
    repetition. Also the base alone on the engine with LoRA on (what the wrapping costs)."""
    adapters = lora_repository(args.dir, args.model, args.lora, args.threads)
    mixed = f"{args.lora} adapters mixed"
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for c in [int(v) for v in args.concurrency.split(",")]:
            for row in (
                asyncio.run(run_continuous(args.dir, args.model, requests, c, side=BASE_ALONE)),
                asyncio.run(
                    run_continuous(args.dir / "lora", args.model, requests, c, adapters, mixed)
                ),
                asyncio.run(
                    run_continuous(args.dir / "lora", args.model, requests, c, side=BASE_LORA_ON)
                ),
            ):
                rows.append({"repeat": repeat, "concurrency": c, **row})
                print(json.dumps(rows[-1]), flush=True)
    report(rows, args, requests, against=BASE_ALONE)


def _summary(
    side: str, tokens: int, seconds: float, ttft: list[float], tpot: list[float], cpu: float
) -> dict[str, Any]:
    """One run's figures; tokens per CPU second (the process's, all its threads) is the
    throughput with the machine's other jobs taken out, for a shared machine."""
    return {
        "side": side,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
        "tpot_p99_ms": round(float(np.percentile(tpot, 99)) * 1e3, 2),
        "tpot_p50_ms": round(float(np.percentile(tpot, 50)) * 1e3, 2),
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1e3, 1),
    }


def use_threads(config: Path, threads: int) -> None:
    """The engine computes with as many threads as `generate` does (intra_op_threads)."""
    settings = tomllib.loads(config.read_text())
    settings.setdefault("backend_options", {})["intra_op_threads"] = threads
    config.write_text(tomli_w.dumps(settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-small")
    parser.add_argument("--dir", type=Path, default=Path(".dlscale/llm-bench"))
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", default="4,8,16", help="comma-separated C values")
    parser.add_argument("--min-output", type=int, default=8)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    # One by default: on a shared machine, a second OpenMP thread waiting at a barrier for a
    # descheduled peer makes each operator take a scheduler time slice.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument(
        "--lora", type=int, default=0, help="N > 0: the base alone against N adapters mixed"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (args.dir / args.model / "config.toml").exists():
        build_zoo(args.dir, [args.model])
    use_threads(args.dir / args.model / "config.toml", args.threads)
    folder = args.dir / args.model / "1"
    requests = workload(
        AutoTokenizer.from_pretrained(folder), args.requests, args.min_output, args.max_output
    )
    print(f"{args.model}: {len(requests)} requests, {sum(n for _, n in requests)} output tokens")
    if args.lora:
        run_lora(args, requests)
        return
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for c in [int(v) for v in args.concurrency.split(",")]:
            for row in (
                run_static(folder, requests, c),
                asyncio.run(run_continuous(args.dir, args.model, requests, c)),
            ):
                rows.append({"repeat": repeat, "concurrency": c, **row})
                print(json.dumps(rows[-1]), flush=True)
    report(rows, args, requests)


def padding_bound(requests: list[Request], batch: int) -> float:
    """Decode slots static batching computes per token a request wants: each batch runs every
    row to its longest output. Where a step's cost grows with its rows (a CPU, compute-bound),
    this bounds what continuous batching can gain; where decoding is bound by memory
    bandwidth (a GPU), extra rows cost little and the gain comes from running more at once."""
    computed = sum(
        len(group) * max(n for _, n in group)
        for group in (requests[i : i + batch] for i in range(0, len(requests), batch))
    )
    return computed / sum(n for _, n in requests)


def paired(
    rows: list[dict[str, Any]],
    c: int,
    side: str,
    against: str = STATIC,
    key: str = "tokens_per_s",
) -> float:
    """The median over repetitions of tokens/s against static's (or `against`'s) in the same
    repetition: the sides of one repetition run back to back, so a busy spell of a shared
    machine touches both."""
    mine = {r["repeat"]: r[key] for r in rows if (r["concurrency"], r["side"]) == (c, side)}
    base = {r["repeat"]: r[key] for r in rows if (r["concurrency"], r["side"]) == (c, against)}
    return statistics.median(mine[k] / base[k] for k in mine)


def report(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    requests: list[Request],
    against: str = STATIC,
) -> None:
    """Medians per side and concurrency, the ratios, and the machine, as a markdown table."""
    keys = ("tokens_per_s", "tokens_per_cpu_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms")
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["concurrency"], row["side"]), []).append(row)
    medians = {
        group: {k: statistics.median(r[k] for r in runs) for k in keys}
        for group, runs in groups.items()
    }
    print(
        f"\n{args.model}, {args.requests} requests, outputs {args.min_output}-"
        f"{args.max_output} tokens, {args.threads} thread(s), medians of {args.repeats}:\n"
    )
    print(
        "| C | side | output tokens/s | tokens per CPU s | TPOT p50 ms | TPOT p99 ms "
        f"| TTFT p50 ms | x {against} (paired) | per CPU s x {against} | padding bound |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (c, side), m in sorted(medians.items()):
        print(
            f"| {c} | {side} | {m['tokens_per_s']:.1f} | {m['tokens_per_cpu_s']:.1f} | "
            f"{m['tpot_p50_ms']:.1f} | {m['tpot_p99_ms']:.1f} | {m['ttft_p50_ms']:.0f} | "
            f"{paired(rows, c, side, against):.2f} | "
            f"{paired(rows, c, side, against, 'tokens_per_cpu_s'):.2f} | "
            f"{padding_bound(requests, c):.2f} |"
        )
    print(json.dumps(machine()))
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows, "machine": machine()}, indent=1))


if __name__ == "__main__":
    main()
