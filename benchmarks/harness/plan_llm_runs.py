"""The measuring half of benchmarks/plan_llm_check.py: the decoders it checks, their runs on an
engine (and, with --kernels, their weight products timed alone first), and the report's table."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.decoder_runs import Measured, measure_backend, measure_model
from benchmarks.harness.kernel_curves import measure_kernels
from dlscale.models.zoo.decoder import DECODERS, DecoderModel
from dlscale.plan.llm import read_config
from dlscale.plan.llm_kernels import KernelCurve, Kernels

#: A size between the zoo's small and 1B decoders (seeded, built from code like them), so the
#: calibration on llama-small is checked on a second memory-bound size on a CPU.
LLAMA_MID = DecoderModel(
    name="llama-mid",
    description="Llama decoder, 12 layers of 768, ~80M parameters (plan check only)",
    hidden_size=768,
    layers=12,
    heads=12,
    kv_heads=4,
    intermediate_size=2048,
    vocab_size=4096,
    max_positions=2048,
)
MODELS = {**DECODERS, LLAMA_MID.name: LLAMA_MID}


def measure_all(
    args: argparse.Namespace,
) -> tuple[list[Measured], dict[str, Any], dict[str, Kernels]]:
    """Every model written, loaded and measured; the rows, each model's config.json and, with
    --kernels, its products timed alone (before the engine loads it)."""
    rows: list[Measured] = []
    configs, kernels = {}, {}
    with tempfile.TemporaryDirectory(prefix="plan-llm-") as tmp:
        for name in args.models:
            started = time.perf_counter()
            folder = MODELS[name].write_hf(Path(tmp) / name)
            configs[name] = json.loads((folder / "config.json").read_text())
            shape = read_config(folder, name)  # the planner reads what the engine loads
            print(f"{shape.summary()} (written in {time.perf_counter() - started:.0f} s)")
            if args.kernels:
                kernels[name] = measure_kernels(shape, args.engine, args.now, args.device)
                print(f"  {name}: products timed alone, {_curve(kernels[name].layers)}")
            rows += measure_engine(args.engine)(name, folder, args)
    return rows, configs, kernels


def _curve(curve: KernelCurve) -> str:
    """The first counts of a curve, in milliseconds."""
    return (
        ", ".join(
            f"{r}: {s * 1e3:.2f}" for r, s in zip(curve.rows[:8], curve.seconds, strict=False)
        )
        + " ms"
    )


def measure_engine(engine: str) -> Callable[[str, Path, argparse.Namespace], list[Measured]]:
    """The runs of one engine (vLLM's imported only when asked for: its own interpreter)."""
    if engine == "vllm":
        from benchmarks.harness.vllm_runs import measure_vllm

        return measure_vllm
    return measure_backend if engine == "backend" else measure_model


def report(result: dict[str, Any]) -> str:
    """The Markdown table of measured against predicted, one row per model and batch."""
    lines = [
        "| model | batch | TTFT ms | plan | err | TPOT ms | plan | err | tok/s | plan | "
        "default plan tok/s | other form TPOT err | within 20% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        p, e = r["predicted"], r["error"]
        alt = r["tpot_error_other_form"]
        other = "-" if alt is None else f"{alt:+.0%}"
        mark = "(calibration)" if r["calibration_point"] else ("yes" if r["within"] else "MISSED")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['ttft_s'] * 1e3:.1f} | {p['ttft_s'] * 1e3:.1f} "
            f"| {e['ttft_s']:+.0%} | {r['tpot_s'] * 1e3:.2f} | {p['tpot_s'] * 1e3:.2f} "
            f"| {e['tpot_s']:+.0%} | {r['tokens_per_s']:,.0f} | {p['tokens_per_s']:,.0f} "
            f"| {r['predicted_default']['tokens_per_s']:,.0f} | {other} | {mark} |"
        )
    return "\n".join(lines)
