"""gpu-check's generative stage: the zoo's ~1B decoder against `dlscale plan`'s prediction.

Its command is benchmarks.plan_llm_check (docs/plan.md, "Generative models"); its reader turns
that script's JSON into verdict rows.
"""

from __future__ import annotations

import json
import subprocess

from benchmarks.gpu_check.figures import Context, Figure


def _count(value: float) -> str:
    return f"{value:,.0f}"


#: The plan's prediction is met when the measurement is within this share of it (issue 25).
PLAN_TOLERANCE = 0.20


def command(ctx: Context) -> list[str]:
    """benchmarks.plan_llm_check: llama-1b in BF16 on the GPU; llama-tiny on one CPU thread."""
    base = [ctx.python, "-m", "benchmarks.plan_llm_check", "--out", str(ctx.out)]
    if ctx.cpu:
        return [*base, "--device", "cpu", "--models", "llama-tiny", "--batches", "1,4"]
    batches = "1,8,32" if ctx.quick else "1,8,32,64"
    return [*base, "--device", "cuda", "--models", "llama-1b", "--batches", batches,
            "--isl", "128", "--osl", "64", "--reps", "2"]  # fmt: skip


def read(ctx: Context) -> list[Figure]:
    """Per batch: measured tokens/s, TTFT and TPOT beside the plan for this device."""
    path = ctx.out / "plan_llm_check.json"
    if not path.exists():
        return [Figure("generative decoder", "not measured", "a run per batch", False)]
    data = json.loads(path.read_text())
    figures: list[Figure] = []
    for row in data["rows"]:
        plan, err = row["predicted_default"], row["error_default"]
        value = (
            f"{_count(row['tokens_per_s'])} tok/s, TTFT {row['ttft_s'] * 1e3:.1f} ms, TPOT "
            f"{row['tpot_s'] * 1e3:.2f} ms; plan {_count(plan['tokens_per_s'])} tok/s, TTFT "
            f"{plan['ttft_s'] * 1e3:.1f} ms, TPOT {plan['tpot_s'] * 1e3:.2f} ms "
            f"({err['tpot_s']:+.0%} TPOT)"
        )
        met = all(abs(e) <= PLAN_TOLERANCE for e in err.values())
        target = f"within {PLAN_TOLERANCE:.0%} of the plan on {data['device']}"
        figures.append(Figure(f"{row['model']} batch {row['batch']}", value, target, met))
    fitted = data.get("calibrated")
    if fitted:
        host = fitted["host_s_per_token"] * 1e6
        implied = (
            f"MBU {fitted['mbu']:.3f}, MFU {fitted['mfu']:.3f}, host {host:.0f} us/token "
            "(plan defaults 0.9, 0.8, 0)"
        )
        figures.append(Figure("what the engine reached (calibrated)", implied))
    return figures


def missing(ctx: Context) -> str | None:
    """Why the decoder cannot run here: no transformers for this interpreter, or one without
    the continuous-batching manager the backend drives (transformers 5; the GPU image's own
    transformers is used, not carried: its dependencies would not fit the wheels' 64 MiB)."""
    probe = (
        "import tokenizers, safetensors, transformers as t\n"
        "from transformers.generation.continuous_batching import ContinuousBatchingManager\n"
        "print(t.__version__)"
    )
    found = subprocess.run([ctx.python, "-c", probe], capture_output=True, text=True, check=False)
    if found.returncode == 0:
        return None
    last = (found.stderr.strip().splitlines() or ["?"])[-1]
    return f"the transformers engine needs transformers 5 with continuous batching: {last}"
