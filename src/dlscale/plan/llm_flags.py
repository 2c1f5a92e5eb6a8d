"""`dlscale plan serve`'s flags for a generative model, declared beside its planner (docs/plan.md,
"Generative"): the CLI adds them to the verb's parser without importing the planner itself."""

from __future__ import annotations

import argparse
from pathlib import Path

#: (flag, type, help) of each valued flag; the help is said after "generative: ".
_VALUED: tuple[tuple[str, type, str], ...] = (
    ("--rate", float, "requests per second to serve"),
    ("--isl", int, "input (prompt) tokens per request"),
    ("--osl", int, "output tokens per request"),
    ("--ttft-ms", float, "time-to-first-token bound (2000)"),
    ("--tpot-ms", float, "time-per-output-token bound (100)"),
    ("--dtype", str, "serve in this dtype (bfloat16, float16, ...)"),
    ("--mbu", float, "share of memory bandwidth (0.9)"),
    ("--mbu-vector", float, "share of memory bandwidth at batch 1 (matrix-vector; --mbu)"),
    ("--mfu", float, "share of peak compute (0.8)"),
    ("--reserve", float, "memory share held back (0.1)"),
    ("--host-us", float, "host work per output token, us (0)"),
    ("--host-us-layer", float, "host work per layer in each forward pass, us (0)"),
    ("--host-us-request", float, "host work per request admitted, us (0)"),
    (
        "--kernels",
        Path,
        "the weights' products timed on the device, a JSON file of rows and seconds "
        "(benchmarks/plan_llm_check.py writes one per model); default: the roofline",
    ),
    ("--kernel-share", float, "share of the --kernels times' speed the engine reaches (1)"),
    (
        "--step-tokens",
        int,
        "tokens one forward pass takes at most (a longer prompt is prefilled in several "
        "passes; default: no limit)",
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The load, the bounds and the efficiencies of a generative plan (a Hugging Face folder or a
    zoo decoder given as --model)."""
    for flag, kind, what in _VALUED:
        parser.add_argument(flag, type=kind, help=f"generative: {what}")
    parser.add_argument(
        "--dense-attention",
        action="store_true",
        help="generative: the engine attends over every key of a pass under a mask "
        "(transformers' SDPA/eager paged path), not each sequence's own",
    )
