"""`dlscale plan serve`'s flags for a generative model, declared beside its planner (docs/plan.md,
"Generative"): the CLI adds them to the verb's parser without importing the planner itself."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The load, the bounds and the efficiencies of a generative plan (a Hugging Face folder or a
    zoo decoder given as --model)."""
    p = parser
    p.add_argument("--rate", type=float, help="generative: requests per second to serve")
    p.add_argument("--isl", type=int, help="generative: input (prompt) tokens per request")
    p.add_argument("--osl", type=int, help="generative: output tokens per request")
    p.add_argument("--ttft-ms", type=float, help="generative: time-to-first-token bound (2000)")
    p.add_argument("--tpot-ms", type=float, help="generative: time-per-output-token bound (100)")
    p.add_argument("--dtype", help="generative: serve in this dtype (bfloat16, float16, ...)")
    p.add_argument("--mbu", type=float, help="generative: share of memory bandwidth (0.9)")
    p.add_argument(
        "--mbu-vector",
        type=float,
        help="generative: share of memory bandwidth at batch 1 (matrix-vector; --mbu)",
    )
    p.add_argument("--mfu", type=float, help="generative: share of peak compute (0.8)")
    p.add_argument("--reserve", type=float, help="generative: memory share held back (0.1)")
    p.add_argument("--host-us", type=float, help="generative: host work per output token, us (0)")
    p.add_argument(
        "--host-us-layer",
        type=float,
        help="generative: host work per layer in each forward pass, us (0)",
    )
    p.add_argument(
        "--host-us-request", type=float, help="generative: host work per request admitted, us (0)"
    )
    p.add_argument(
        "--kernels",
        type=Path,
        help="generative: the weights' products timed on the device, a JSON file of rows and "
        "seconds (benchmarks/plan_llm_check.py writes one per model); default: the roofline",
    )
    p.add_argument(
        "--kernel-share",
        type=float,
        help="generative: share of the --kernels times' speed the engine reaches (1)",
    )
    p.add_argument(
        "--step-tokens",
        type=int,
        help="generative: tokens one forward pass takes at most (a longer prompt is prefilled "
        "in several passes; default: no limit)",
    )
    p.add_argument(
        "--dense-attention",
        action="store_true",
        help="generative: the engine attends over every key of a pass under a mask "
        "(transformers' SDPA/eager paged path), not each sequence's own",
    )
