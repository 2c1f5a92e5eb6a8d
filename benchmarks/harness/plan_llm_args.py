"""The flags of `python -m benchmarks.plan_llm_check`."""

from __future__ import annotations

import argparse
from pathlib import Path


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The check's flags (benchmarks/plan_llm_check.py says what each run does)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.plan_llm_check", description=doc)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    models = ["llama-tiny", "llama-small", "llama-mid"]
    p.add_argument("--models", type=lambda s: s.split(","), default=models)
    p.add_argument(
        "--calibrate-on",
        type=lambda s: s.split(","),
        default=models[:2],
        help="the models whose runs calibrate (two sizes tell the host's time per layer apart; "
        "default llama-tiny,llama-small); the others are predicted",
    )
    batches = [1, 2, 4, 8, 16]
    p.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=batches)
    p.add_argument(
        "--engine",
        choices=["backend", "vllm", "forward"],
        default="backend",
        help="dlscale's transformers backend (continuous batching), its vLLM backend, or the "
        "model's forward alone",
    )
    p.add_argument(
        "--vllm-compile",
        action="store_true",
        help="vllm: let the engine compile its model (eager by default: minutes saved)",
    )
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        help="time by the process's CPU time (default on the CPU) or the wall (on a GPU)",
    )
    p.add_argument("--isl", type=int, default=64)
    p.add_argument("--osl", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="CPU: torch threads (and planned cores)")
    p.add_argument(
        "--calibrate-batch",
        type=int,
        help="the first model's second decode batch to fit (default: the largest; 1: no host term)",
    )
    p.add_argument(
        "--matrix-batch",
        type=int,
        help="the first model's smallest matrix-matrix decode batch, fitted to tell batch 1's "
        "matrix-vector MBU apart (0: one MBU for every batch; default: "
        "2 for the transformers engine, 0 for vLLM's)",
    )
    p.add_argument(
        "--passes",
        action="store_true",
        help="backend: time each engine pass (its sequences, the engine thread's CPU) and keep "
        "the fastest run's in measured.json",
    )
    p.add_argument(
        "--one-pass",
        action="store_true",
        help="predict every engine as one pass per burst's prompts and per-sequence attention "
        "(the model before the engine's scheduling was counted)",
    )
    p.add_argument(
        "--kernels",
        action=argparse.BooleanOptionalAction,
        help="time the engine's matrix products alone at each model's shapes and price each "
        "pass's weights by them (default on a CPU; --no-kernels: the roofline's MBU and MFU)",
    )
    p.add_argument(
        "--first-pass-requests",
        type=int,
        help="predict a burst's first pass holding its first N requests only, the rest joining "
        "the next (vLLM's engine core steps as soon as one is in; default: all in the first)",
    )
    p.add_argument("--from", dest="source", type=Path, help="an earlier run's measured.json")
    p.add_argument("--out", type=Path)
    return p
