"""Check the generative planner against measured runs: TTFT, TPOT and tokens/s per batch.

    python -m benchmarks.plan_llm_check [--device cpu|cuda] [--models llama-small,llama-mid]
        [--batches 1,2,4,8,16] [--isl 64] [--osl 16] [--reps 5] [--threads 1] [--out DIR]

For each zoo decoder (written as its Hugging Face folder, loaded with transformers as the
transformers backend loads it) and each batch B: B prompts of ISL random tokens prefilled in
one pass (TTFT), then OSL - 1 decode steps on the KV cache (TPOT, the mean step, as MLPerf
defines it); the fastest of --reps repetitions (other work on a shared host only slows a run).

The plan (`dlscale.plan.llm_capacity`) reads the folder's config.json and the device's figures:
on the CPU the catalog's computed peak for --threads cores and the memory bandwidth measured
here with torch at the same thread count; on a GPU its catalog entry. MBU and MFU are
calibrated once, on the first model's batch-1 decode and prefill, and every other (model,
batch) is predicted; the catalog defaults (MBU 0.9, MFU 0.8) are predicted beside. A
prediction within 20% of the measurement meets the target; the rest are reported as missed.
Results: OUT/plan_llm_check.json (bench-results/plan-llm-check-<time>/ by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dlscale.bench import environment
from dlscale.errors import PlanError
from dlscale.hardware.catalog import match
from dlscale.hardware.cpu import cpu_spec, read_cpu
from dlscale.hardware.spec import DeviceSpec
from dlscale.models.zoo.decoder import DECODERS, DecoderModel
from dlscale.plan.host_memory import with_bandwidth
from dlscale.plan.llm import read_config
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency, calibrate

#: The share a prediction may miss by (issue 25: "checked against measured runs within 20%").
TOLERANCE = 0.20
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


@dataclass
class Measured:
    """One model at one batch: seconds to the first token and per later token, fastest rep."""

    model: str
    batch: int
    ttft_s: float
    tpot_s: float
    tpot_median_s: float
    #: Prompt tokens per request (the backend's count of the text prompt; --isl for forward).
    isl: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.tpot_s


def measure(model: Any, batch: int, args: argparse.Namespace, vocab: int) -> tuple[float, float]:
    """(TTFT, TPOT) of one run: a prefill of `batch` prompts, then OSL - 1 decode steps."""
    from transformers import DynamicCache

    device = model.device
    prompts = torch.randint(0, vocab, (batch, args.isl), generator=torch.Generator().manual_seed(0))
    prompts = prompts.to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        try:
            cache = DynamicCache(config=model.config)
        except TypeError:  # transformers before 4.56 takes no config
            cache = DynamicCache()
        sync()
        start = args.now()
        out = model(prompts, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        sync()
        first = args.now()
        for _ in range(args.osl - 1):
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        sync()
        end = args.now()
    return first - start, (end - first) / max(1, args.osl - 1)


def measure_model(name: str, folder: Path, args: argparse.Namespace) -> list[Measured]:
    """Every batch of one model, the fastest of --reps runs each (one warm-up run first)."""
    from transformers import AutoModelForCausalLM

    # The dtype the folder's config names, set explicitly: transformers 4.x loads FP32 unless
    # told, 5.x the config's (the GPU image's transformers may be either).
    dtype = getattr(torch, read_config(folder).dtype)
    model = AutoModelForCausalLM.from_pretrained(folder).to(args.device, dtype).eval()
    vocab = model.config.vocab_size
    measure(model, 1, args, vocab)  # warm-up: allocations, kernel choices
    # Repetitions go round the batches, so that a burst of other work spoils one run of several
    # batches rather than every run of one.
    runs: dict[int, list[tuple[float, float]]] = {b: [] for b in args.batches}
    for rep in range(args.reps):
        for batch in args.batches:
            runs[batch].append(measure(model, batch, args, vocab))
        print(f"  {name}: repetition {rep + 1} of {args.reps} done", flush=True)
    rows = []
    for batch, done in runs.items():
        tpots = [t for _, t in done]
        row = Measured(
            name, batch, min(f for f, _ in done), min(tpots), statistics.median(tpots), args.isl
        )
        rows.append(row)
        took = f"TTFT {row.ttft_s * 1e3:.1f} ms, TPOT {row.tpot_s * 1e3:.2f} ms"
        print(f"  {name} batch {batch}: {took} (TPOT median {row.tpot_median_s * 1e3:.2f} ms)")
    del model
    return rows


class Prompts:
    """Prompts of about ISL tokens cut one after another from the zoo's seeded corpus.

    Never the same text twice: the engine's paged cache would reuse a prompt's prefix and skip
    its prefill.
    """

    def __init__(self, folder: Path, tokens: int, count: int) -> None:
        from transformers import AutoTokenizer

        from dlscale.models.zoo.decoder_tokenizer import corpus

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        text = " ".join(corpus(2 * tokens * count, 1))
        self.ids = self.tokenizer(text, add_special_tokens=False, verbose=False).input_ids
        self.tokens, self.next = tokens, 0

    def take(self, batch: int) -> list[str]:
        """The next `batch` prompts."""
        out = []
        for _ in range(batch):
            piece = self.ids[self.next : self.next + self.tokens]
            if len(piece) < self.tokens:
                raise RuntimeError("the corpus ran out of prompts")
            out.append(self.tokenizer.decode(piece))
            self.next += self.tokens
        return out


async def backend_run(
    backend: Any, prompts: list[str], osl: int, now: Callable[[], float]
) -> tuple[float, float, float]:
    """(TTFT, TPOT, mean prompt tokens) of `prompts` streamed at once through the backend.

    TTFT is the last request's first token (all B prompts prefilled), TPOT the mean over the
    requests of (last token - first token) / (tokens - 1).
    """
    import asyncio

    import numpy as np

    params = {"max_tokens": osl, "ignore_eos": True, "temperature": 0.0}

    async def one(index: int, prompt: str) -> tuple[float, float, int]:
        inputs = {"text_input": np.array([prompt.encode()], dtype=object)}
        times, count, prompt_tokens = [], 0, 0
        async for part in backend.stream(str(index), inputs, params):
            if "num_output_tokens" in part.outputs:
                times.append(now())
                count = int(part.outputs["num_output_tokens"][0])
                prompt_tokens = int(part.outputs["num_input_tokens"][0])
        return times[0] - start, (times[-1] - times[0]) / max(1, count - 1), prompt_tokens

    start = now()
    done = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    ttft = max(d[0] for d in done)
    return ttft, statistics.mean(d[1] for d in done), statistics.mean(d[2] for d in done)


def measure_backend(name: str, folder: Path, args: argparse.Namespace) -> list[Measured]:
    """Every batch through dlscale's transformers backend, B requests at once, round-robin."""
    import asyncio

    from dlscale.backends import BackendOptions, create_backend

    device = "cuda:0" if args.device == "cuda" else "cpu"
    threads = args.threads if args.device == "cpu" else 0
    options = BackendOptions(device=device, intra_op_threads=threads)
    backend = create_backend("transformers", folder / "config.json", options)
    backend.load()
    try:
        prompts = Prompts(folder, args.isl, 1 + args.reps * sum(args.batches))
        warm = prompts.take(1)
        asyncio.run(backend_run(backend, warm, args.osl, args.now))  # allocations, kernel choices
        runs: dict[int, list[tuple[float, float, float]]] = {b: [] for b in args.batches}
        for rep in range(args.reps):
            for batch in args.batches:
                run = backend_run(backend, prompts.take(batch), args.osl, args.now)
                runs[batch].append(asyncio.run(run))
            print(f"  {name}: repetition {rep + 1} of {args.reps} done", flush=True)
    finally:
        backend.unload()
    rows = []
    for batch, done in runs.items():
        tpots = [t for _, t, _ in done]
        row = Measured(
            name, batch, min(f for f, _, _ in done), min(tpots), statistics.median(tpots)
        )
        row.isl = round(statistics.mean(n for _, _, n in done))
        rows.append(row)
        took = f"TTFT {row.ttft_s * 1e3:.1f} ms, TPOT {row.tpot_s * 1e3:.2f} ms"
        print(f"  {name} batch {batch}: {took} (prompts of {row.isl} tokens)", flush=True)
    return rows


def torch_read_bandwidth(now: Callable[[], float], runs: int = 10) -> float:
    """Bytes/s of torch summing 256 MiB on its threads: the reads the engine makes."""
    data = torch.ones(64 << 20, dtype=torch.float32)
    best = float("inf")
    for _ in range(runs):
        start = now()
        data.sum()
        best = min(best, now() - start)
    return data.numel() * 4 / best


def plan_device(args: argparse.Namespace) -> DeviceSpec:
    """The device the plan predicts for: this GPU's catalog entry, or the CPU at --threads."""
    if args.device == "cuda":
        # torch's name of the GPU matched as NVML's is (the catalog's patterns; no NVML needed).
        props = torch.cuda.get_device_properties(0)
        found = match(props.name, float(props.total_memory))
        if found is None:
            raise SystemExit(f"plan_llm_check: {props.name} is not in the catalog")
        return found
    info = read_cpu()
    cores = min(args.threads, info.physical_cores)
    spec = cpu_spec(replace(info, physical_cores=cores))
    bandwidth = torch_read_bandwidth(args.now)
    spec = with_bandwidth(spec, bandwidth)
    how = (
        f"measured: torch sum over 256 MiB on {args.threads} thread(s), best of 10 by {args.clock}"
    )
    return replace(spec, sources={**spec.sources, "bandwidth": how})


def predict(
    on_device: DecoderOnDevice, row: Measured, args: argparse.Namespace
) -> dict[str, float]:
    """The plan's TTFT, TPOT and tokens/s for a measured row (decode at the mean context)."""
    ttft = on_device.prefill_s(row.isl, row.batch)
    tpot = on_device.decode_step_s(row.batch, row.isl + args.osl / 2)
    return {"ttft_s": ttft, "tpot_s": tpot, "tokens_per_s": row.batch / tpot}


def compare(
    rows: list[Measured], shapes: dict[str, Any], device: DeviceSpec, args: argparse.Namespace
) -> tuple[Efficiency | None, str, list[dict[str, Any]]]:
    """Calibrate on the first model's batch-1 run, then predict every row both ways.

    Rows are judged on the calibrated plan; where no MBU/MFU fits the reference (a model so
    small that the host's per-step work dominates), on the catalog defaults, and it says why.
    """
    first = rows[0].model
    reference = next(r for r in rows if r.model == first and r.batch == args.calibrate_batch)
    alone = next(r for r in rows if r.model == first and r.batch == 1)
    base = DecoderOnDevice(shapes[reference.model], device, Efficiency(1.0, 1.0))
    decode = [(r.batch, r.isl + args.osl / 2, r.tpot_s) for r in dict.fromkeys([alone, reference])]
    prefill = (alone.isl, 1, alone.ttft_s)
    fitted: Efficiency | None = None
    try:
        fitted = calibrate(base, decode, prefill)
        at = " and ".join(str(d[0]) for d in decode)
        judged_on = f"calibrated on {first}: decode at batch {at}, prefill of one prompt"
    except PlanError as exc:
        judged_on = f"the catalog defaults (no calibration: {exc})"
    # The step form not chosen for this device (max on a CPU, sum on a GPU), calibrated alike:
    # its TPOT error is reported beside, the evidence for the choice.
    other = replace(device, kind="gpu" if device.kind == "cpu" else "cpu")
    try:
        alt = DecoderOnDevice(shapes[reference.model], other, Efficiency(1.0, 1.0))
        other_fit = calibrate(alt, decode, prefill)
    except PlanError:
        other_fit = None
    out = []
    for row in rows:
        shape = shapes[row.model]
        other_tpot = None
        if other_fit is not None:
            other_plan = predict(DecoderOnDevice(shape, other, other_fit), row, args)
            other_tpot = other_plan["tpot_s"] / row.tpot_s - 1
        default = predict(DecoderOnDevice(shape, device), row, args)
        calibrated = predict(DecoderOnDevice(shape, device, fitted), row, args) if fitted else None
        judged = calibrated or default
        errors = {k: judged[k] / getattr(row, k) - 1 for k in ("ttft_s", "tpot_s", "tokens_per_s")}
        default_errors = {k: default[k] / getattr(row, k) - 1 for k in errors}
        out.append(
            {
                **asdict(row),
                "tokens_per_s": row.tokens_per_s,
                "calibration_point": fitted is not None and row in (reference, alone),
                "predicted": judged,
                "predicted_default": default,
                "error": errors,
                "error_default": default_errors,
                "tpot_error_other_form": other_tpot,
                "within": all(abs(e) <= TOLERANCE for e in errors.values()),
            }
        )
    return fitted, judged_on, out


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Batch 1 gives the prefill of one prompt and a decode step; --calibrate-batch (the largest
    # by default) a second decode step, which tells the host time per token apart.
    args.calibrate_batch = args.calibrate_batch or max(args.batches)
    args.batches = sorted({1, args.calibrate_batch, *args.batches})
    clock = args.clock or ("cpu" if args.device == "cpu" else "wall")
    # On a shared CPU the process's CPU time is what the run takes alone: other tenants taking
    # the core do not count (their traffic on the memory bus still does). A GPU run: the wall.
    args.now = time.process_time if clock == "cpu" else time.perf_counter
    args.clock = clock
    if args.device == "cuda" and not torch.cuda.is_available():
        print("plan_llm_check: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    out = args.out or environment_folder()
    out.mkdir(parents=True, exist_ok=True)
    device = plan_device(args)
    rows: list[Measured] = []
    shapes = {}
    with tempfile.TemporaryDirectory(prefix="plan-llm-") as tmp:
        for name in args.models:
            started = time.perf_counter()
            folder = MODELS[name].write_hf(Path(tmp) / name)
            shapes[name] = read_config(folder, name)  # the planner reads what the engine loads
            print(f"{shapes[name].summary()} (written in {time.perf_counter() - started:.0f} s)")
            measure_one = measure_backend if args.engine == "backend" else measure_model
            rows += measure_one(name, folder, args)
    fitted, judged_on, compared = compare(rows, shapes, device, args)
    result = {
        "format": "dlscale-plan-llm-check/1",
        "device": device.name,
        "device_figures": {
            "memory_bandwidth": device.memory_bandwidth,
            "bandwidth_source": device.source("bandwidth"),
            "peak_flops": {s.precision: device.peak_flops(s.precision) for s in shapes.values()},
        },
        "calibrated": asdict(fitted) if fitted else None,
        "judged_on": judged_on,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "now")},
        "host": environment.host(),
        "load_average": list(environment_load()),
        "rows": compared,
    }
    (out / "plan_llm_check.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "report.md").write_text(report(result) + "\n")
    print(f"\n{device.name}: predictions from {judged_on}")
    if fitted:
        host = fitted.host_s_per_token * 1e6
        print(f"calibrated MBU {fitted.mbu:.3f}, MFU {fitted.mfu:.3f}, host {host:.0f} us/token")
    print(report(result))
    judged = [r for r in compared if not r["calibration_point"]]
    held = sum(r["within"] for r in judged)
    print(f"\n{held} of {len(judged)} predictions within {TOLERANCE:.0%}; results in {out}/")
    return 0


def environment_folder() -> Path:
    return Path("bench-results") / f"plan-llm-check-{time.strftime('%Y%m%d-%H%M%S')}"


def environment_load() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plan_llm_check", description=__doc__)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--models", type=lambda s: s.split(","), default=["llama-small", "llama-mid"])
    batches = [1, 2, 4, 8, 16]
    p.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=batches)
    p.add_argument(
        "--engine",
        choices=["backend", "forward"],
        default="backend",
        help="dlscale's transformers backend (continuous batching), or the model's forward alone",
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
    p.add_argument("--out", type=Path)
    return p


if __name__ == "__main__":
    sys.exit(main())
