"""Prefix routing against least-work routing: two replicas of one decoder, tenants with long
system prompts, the same fleet and the same requests.

    python -m benchmarks.prefix_routing [--model llama-small] [--tenants 6]
        [--prefix-tokens 1500] [--rate 0.12] [--requests 12] [--rounds 3] [--cache-share S]

`dlscale serve REPO --device-workers 2` (two CPU worker processes behind HAProxy, one torch
thread each) serves a zoo decoder (llama-small; a context under 2048 positions is raised to it:
RoPE has no learned positions) on the transformers engine twice: `chat-prefix` routes by prefix
(`[routing] policy = "prefix"`, the first 1024 bytes), `chat-least` by least work (the default).
Each engine's KV cache holds the prefixes of all tenants but one (`--cache-share`; plus 1024
tokens for the sequences in flight): together the two hold them all, one alone does not. So
least work, which sends every tenant to both engines, misses about one request in `--tenants`
(more than the 10% a p90 shows), and prefix routing misses none once warm, whichever way the
hash splits the tenants (unless all on one replica). Each tenant's
system prompt is `--prefix-tokens` tokens of the zoo's seeded corpus; each request is one chat
message, the tenant's prompt then a short turn, 16 tokens out, Poisson arrivals at `--rate` per
second (open loop), tenants drawn at random. Both arms get the same requests; in each round both
run, in alternating order, each on its own engines (their caches are not shared), after one
unmeasured request per tenant and arm. Reported per arm, medians over the rounds: TTFT p50 and
p90, output tokens/s, the fleet's CPU seconds per output token, each worker's share of the
requests (from the fleet's merged metrics), the engines' prefix-cache hit rate (prompt tokens
found in the cache over those looked up, `vllm:prefix_cache_hits_total` over `_queries_total`
summed over the workers), and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    cpu_seconds,
    dlscale_exe,
    free_port,
    thread_env,
    wait_ready,
)
from benchmarks.harness.statistics import machine
from dlscale.bench.generative.client import StreamClient
from dlscale.bench.generative.endpoints import Ask, Endpoint
from dlscale.bench.generative.load import Job, open_loop, poisson_offsets
from dlscale.bench.generative.records import StreamRecord
from dlscale.models.zoo import build_zoo
from dlscale.models.zoo.decoder_tokenizer import corpus

CONTEXT = 2048
PREFIX, LEAST = "chat-prefix", "chat-least"
ROUTING = {PREFIX: '[routing]\npolicy = "prefix"\nprefix_bytes = 1024\n', LEAST: ""}
#: Tokens the cache keeps beyond the prefixes it is sized for: the sequences in flight.
IN_FLIGHT_TOKENS = 4 * 256
OUTPUT_TOKENS = 16
WORKERS = 2


def kv_bytes_per_token(hf: dict[str, Any]) -> int:
    """FP32 keys and values of one token over every layer."""
    heads = hf["num_attention_heads"]
    dims = hf.get("head_dim") or hf["hidden_size"] // heads
    return 2 * hf["num_hidden_layers"] * hf.get("num_key_value_heads", heads) * dims * 4


def repository(work: Path, zoo_model: str, kv_tokens: int) -> Path:
    """REPO with the decoder as chat-prefix and chat-least, each engine's cache `kv_tokens`."""
    zoo = work / "zoo"
    if not (zoo / zoo_model).exists():
        build_zoo(zoo, [zoo_model])
    repo = work / "repo-prefix-routing"
    shutil.rmtree(repo, ignore_errors=True)
    for name, routing in ROUTING.items():
        shutil.copytree(zoo / zoo_model / "1", repo / name / "1")
        config = repo / name / "1" / "config.json"
        hf = json.loads(config.read_text())
        hf["max_position_embeddings"] = max(CONTEXT, hf["max_position_embeddings"])
        config.write_text(json.dumps(hf))
        gib = kv_tokens * kv_bytes_per_token(hf) / 2**30
        (repo / name / "config.toml").write_text(
            f'backend = "transformers"\ninstances = [{{ count = 1, device = "cpu" }}]\n'
            f"[backend_options]\nkv_cache_gib = {gib:.6f}\nintra_op_threads = 1\n"
            f"max_num_seqs = 4\nmax_model_len = {CONTEXT}\n{routing}"
        )
    return repo


def prompts(tokenizer: Any, tenants: int, prefix_tokens: int) -> list[str]:
    """Each tenant's system prompt: lines of the seeded corpus up to `prefix_tokens` tokens."""
    found = []
    for tenant in range(tenants):
        lines, text = corpus(4 * prefix_tokens, seed=100 + tenant), f"Tenant {tenant}."
        for line in lines:
            if len(tokenizer(text + " " + line).input_ids) > prefix_tokens:
                break
            text += " " + line
        found.append(text)
    return found


def jobs(systems: list[str], count: int, rate: float, seed: int) -> list[Job]:
    """`count` requests at `rate` per second, each a random tenant's prompt and a short turn."""
    rng = np.random.default_rng(seed)
    words = corpus(8 * count, seed=seed)
    made = []
    for i, offset in enumerate(poisson_offsets(count, rate, seed)):
        tenant = int(rng.integers(len(systems)))
        turn = f"\n\nUser {i}: {words[i % len(words)][:80]}"
        ask = Ask(systems[tenant] + turn, OUTPUT_TOKENS)
        made.append(Job(ask, 0, offset))
    return made


def start_fleet(repo: Path) -> tuple[ServerProcess, int]:
    """`dlscale serve REPO --device-workers 2`, ready through its router; its metrics port."""
    port, metrics = free_port(), free_port()
    argv = [dlscale_exe(), "serve", str(repo), "--device-workers", str(WORKERS),
            "--http-port", str(port), "--grpc-port", "-1", "--metrics-port", str(metrics),
            "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(argv, text=True, env=thread_env(), start_new_session=True)
    server = ServerProcess("prefix-routing", proc, port)
    wait_ready(server, [f"/v2/models/{m}/ready" for m in ROUTING], timeout_s=600)
    return server, metrics


def served(metrics: int, model: str) -> tuple[dict[str, float], dict[str, float]]:
    """Each worker's successes of `model` ("device" keys), and the prompt tokens its engines
    looked up in their prefix caches and found ("queries", "hits"), from the merged metrics."""
    with urllib.request.urlopen(f"http://{HOST}:{metrics}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found, counts = {}, {}
    pattern = rf'^nv_inference_request_success\{{(.*model="{model}".*)\}} (\S+)$'
    for labels, value in re.findall(pattern, text, re.M):
        device = re.search(r'device="([^"]+)"', labels)
        if device is not None:
            found[device.group(1)] = float(value)
    for key in ("queries", "hits"):
        pattern = rf'^vllm:prefix_cache_{key}_total\{{.*model_name="{model}".*\}} (\S+)$'
        counts[key] = sum(float(v) for v in re.findall(pattern, text, re.M))
    return found, counts


async def one_arm(url: str, model: str, work: list[Job]) -> list[StreamRecord]:
    async with StreamClient(url, Endpoint.CHAT, model) as client:
        return await open_loop(client, work)


async def warm(url: str, systems: list[str]) -> None:
    """Each tenant's prompt once to each arm, one at a time: the caches start where each
    routing puts the tenants, not empty (a cold start is the same miss on both arms)."""
    for model in ROUTING:
        async with StreamClient(url, Endpoint.CHAT, model) as client:
            for system in systems:
                record = await client.stream(Ask(system + "\n\nUser: hello", 1))
                if record.error:
                    raise RuntimeError(f"warm-up of {model}: {record.error}")


def measure(server: ServerProcess, metrics: int, model: str, work: list[Job]) -> dict[str, Any]:
    """One arm's round: its figures and where its requests went."""
    (before, looked), cpu = served(metrics, model), cpu_seconds(server.proc.pid)
    load = os.getloadavg()[0]
    start = time.perf_counter_ns()
    records = asyncio.run(one_arm(f"http://{HOST}:{server.port}", model, work))
    wall_s = (max(r.done_ns for r in records) - start) / 1e9
    (after, looked_after), spent = served(metrics, model), cpu_seconds(server.proc.pid) - cpu
    queries = looked_after["queries"] - looked["queries"]
    ok = [r for r in records if r.ok and not r.error]
    ttfts = [r.ttft_ns / 1e6 for r in ok if r.ttft_ns is not None]
    tokens = sum(r.tokens for r in ok)
    shares = {d: after.get(d, 0.0) - before.get(d, 0.0) for d in after}
    total = sum(shares.values()) or 1.0
    return {
        "errors": len(records) - len(ok),
        "ttft_p50_ms": float(np.percentile(ttfts, 50)) if ttfts else None,
        "ttft_p90_ms": float(np.percentile(ttfts, 90)) if ttfts else None,
        "tokens_per_s": tokens / wall_s,
        "cpu_ms_per_token": 1000 * spent / max(1, tokens),
        "max_share": max(shares.values()) / total if shares else None,
        "prefix_hit_rate": (looked_after["hits"] - looked["hits"]) / queries if queries else None,
        "shares": {d: v / total for d, v in sorted(shares.items())},
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-small", help="the zoo's decoder")
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=0.12, help="requests per second")
    parser.add_argument("--requests", type=int, default=12, help="per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cache-share",
        type=float,
        default=None,
        help="of all prefixes, in one engine's cache (default: all tenants but one)",
    )
    args = parser.parse_args()
    share = args.cache_share or (args.tenants - 1) / args.tenants
    kv_tokens = int(share * args.tenants * args.prefix_tokens) + IN_FLIGHT_TOKENS
    repo = repository(WORK, args.model, kv_tokens)
    tokenizer = AutoTokenizer.from_pretrained(repo / PREFIX / "1")
    systems = prompts(tokenizer, args.tenants, args.prefix_tokens)
    server, metrics = start_fleet(repo)
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(warm(f"http://{HOST}:{server.port}", systems))
        for rnd in range(args.rounds):
            work = jobs(systems, args.requests, args.rate, seed=rnd)
            order = (PREFIX, LEAST) if rnd % 2 == 0 else (LEAST, PREFIX)
            for model in order:
                row = {"round": rnd, "arm": model, **measure(server, metrics, model, work)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.stop()
    report(args, kv_tokens, rows)


def report(args: argparse.Namespace, kv_tokens: int, rows: list[dict[str, Any]]) -> None:
    """Medians per arm, the paired ratios, and the results file."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"prefix-routing-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"machine": machine(), "args": vars(args), "kv_tokens": kv_tokens, "rows": rows},
            indent=1,
        )
    )
    keys = ("ttft_p50_ms", "ttft_p90_ms", "tokens_per_s", "cpu_ms_per_token", "max_share")
    keys += ("prefix_hit_rate",)
    print("\n| arm | " + " | ".join(keys) + " | errors |")
    print("|---" * (len(keys) + 2) + "|")
    for arm in ROUTING:
        mine = [r for r in rows if r["arm"] == arm]
        known = [[r[k] for r in mine if r[k] is not None] for k in keys]
        cells = [f"{statistics.median(v):.3g}" if v else "n/a" for v in known]
        print(f"| {arm} | " + " | ".join(cells) + f" | {sum(r['errors'] for r in mine)} |")
    for key in ("ttft_p90_ms", "tokens_per_s"):
        ratios = [
            least[key] / prefix[key]
            for prefix, least in zip(
                [r for r in rows if r["arm"] == PREFIX], [r for r in rows if r["arm"] == LEAST],
                strict=True,
            )
        ]  # fmt: skip
        print(f"{key}: least-work / prefix per round {[round(x, 2) for x in ratios]}, "
              f"median {statistics.median(ratios):.2f}")  # fmt: skip
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
