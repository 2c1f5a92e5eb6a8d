"""The generative bench's flags on `dlscale bench` (cli.py parses; commands.py reads them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def add_flags(p: argparse.ArgumentParser, path: Callable[[str], Path]) -> None:
    """The generative bench's own flags (docs/bench.md, *Generative bench*)."""
    g = p.add_argument_group("generative endpoints (OpenAI, OIP generate)")
    g.add_argument(
        "--generative",
        metavar="openai|chat|generate",
        help="token-level bench of an OpenAI /v1/completions (openai), /v1/chat/completions "
        "(chat) or OIP generate_stream (generate) endpoint; MLPerf LoadGen runs only with "
        "--scenario server, offline or all",
    )
    g.add_argument("--tokenizer", type=path, help="the model's folder (tokenizer.json)")
    g.add_argument("--api-key", help="bearer key for a server with one (default: $OPENAI_API_KEY)")
    g.add_argument("--isl", type=int, default=128, help="input tokens, mean (default 128)")
    g.add_argument("--isl-stddev", type=float, default=0.0, help="input tokens, stddev")
    g.add_argument("--osl", type=int, default=128, help="output tokens, mean (default 128)")
    g.add_argument("--osl-stddev", type=float, default=0.0, help="output tokens, stddev")
    g.add_argument("--requests", type=int, default=64, help="requests per point (default 64)")
    g.add_argument("--warmup-requests", type=int, default=2, help="unmeasured first requests")
    g.add_argument("--rate", metavar="R[,R...]", help="request-rate sweep (Poisson), requests/s")
    g.add_argument("--trace", type=path, help="JSONL trace replayed on its timestamps")
    g.add_argument("--trace-speedup", type=float, default=1.0, help="replay faster (2 = 2x)")
    g.add_argument("--ttft-ms", type=float, help="TTFT bound: goodput SLO and LoadGen's p99")
    g.add_argument("--tpot-ms", type=float, help="TPOT bound: goodput SLO and LoadGen's p99")
    g.add_argument(
        "--mlperf-bounds", help="LoadGen TTFT/TPOT bounds of an MLPerf LLM (default llama2-70b)"
    )
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the server to ignore EOS so outputs reach --osl (default on)",
    )
    g.add_argument("--temperature", type=float, help="sampling temperature (default: server's)")
