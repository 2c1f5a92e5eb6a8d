"""Timed decoder runs for benchmarks/plan_llm_check.py: TTFT and TPOT per batch.

Through dlscale's transformers backend (B requests streamed at once) or the model's own forward
passes on a KV cache; the clock is the caller's (the process's CPU time on a shared CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlscale.plan.llm import read_config


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
    #: With --passes: the fastest run's engine passes, (sequences, CPU seconds) each.
    passes: list[tuple[int, float]] = field(default_factory=list)

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
            out.append(str(self.tokenizer.decode(piece)))
            self.next += self.tokens
        return out


async def backend_run(
    backend: Any, prompts: list[str], osl: int, now: Callable[[], float]
) -> tuple[float, float | None, float]:
    """(TTFT, TPOT, mean prompt tokens) of `prompts` streamed at once through the backend.

    TTFT is the last request's first token (all B prompts prefilled), TPOT the mean over the
    requests of (last token - first token) / the tokens between (an engine whose reader lags
    may hand over several tokens in one part; None where every request's tokens came in one
    part: vLLM handed llama-tiny's 16 tokens so, under load, and a 0 was the batch's fastest).
    """
    import asyncio

    import numpy as np

    params = {"max_tokens": osl, "ignore_eos": True, "temperature": 0.0}

    async def one(index: int, prompt: str) -> tuple[float, float, int]:
        inputs = {"text_input": np.array([prompt.encode()], dtype=object)}
        times, counts, prompt_tokens = [], [], 0
        async for part in backend.stream(str(index), inputs, params):
            if "num_output_tokens" in part.outputs:
                times.append(now())
                counts.append(int(part.outputs["num_output_tokens"][0]))
                prompt_tokens = int(part.outputs["num_input_tokens"][0])
        between = counts[-1] - counts[0]
        # Every token in one part (a reader that lagged the whole run): no step was timed.
        tpot = (times[-1] - times[0]) / between if between > 0 else None
        return times[0] - start, tpot, prompt_tokens

    start = now()
    done = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    ttft = max(d[0] for d in done)
    steps = [d[1] for d in done if d[1] is not None]
    return ttft, statistics.mean(steps) if steps else None, statistics.mean(d[2] for d in done)


class PassClock:
    """A step gate (the backend's `pace` hook, contract.StepGate) that times each engine pass
    by the engine thread's CPU clock and counts its sequences: how the engine split a burst."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []

    @contextlib.contextmanager
    def step(self, rows: int) -> Iterator[None]:
        start = time.thread_time()
        try:
            yield
        finally:
            self.passes.append((rows, time.thread_time() - start))

    def rest(self) -> None:
        """Nothing is held between passes."""

    def take(self) -> list[tuple[int, float]]:
        """The passes since the last take."""
        taken, self.passes = self.passes, []
        return taken


def measure_backend(name: str, folder: Path, args: argparse.Namespace) -> list[Measured]:
    """Every batch through dlscale's transformers backend, B requests at once, round-robin."""
    from dlscale.backends import BackendOptions, create_backend

    device = "cuda:0" if args.device == "cuda" else "cpu"
    threads = args.threads if args.device == "cpu" else 0
    options = BackendOptions(device=device, intra_op_threads=threads)
    backend = create_backend("transformers", folder / "config.json", options)
    backend.load()
    from dlscale.backends.generative.contract import PacedBackend

    clock = None
    if getattr(args, "passes", False) and isinstance(backend, PacedBackend):
        clock = PassClock()
        backend.pace(clock)
    try:
        return streamed_rows(name, backend, folder, args, args.now, clock)
    finally:
        backend.unload()


def streamed_rows(
    name: str,
    backend: Any,
    folder: Path,
    args: argparse.Namespace,
    now: Callable[[], float],
    clock: PassClock | None = None,
) -> list[Measured]:
    """Every batch streamed through a loaded generative backend, --reps times round the
    batches, on one event loop (an engine may bind its output task to the first loop); with
    a pass clock, each run's passes."""
    import asyncio

    prompts = Prompts(folder, args.isl, 1 + args.reps * sum(args.batches))
    Run = tuple[float, float | None, float, list[tuple[int, float]]]

    async def rounds() -> dict[int, list[Run]]:
        await backend_run(backend, prompts.take(1), args.osl, now)  # allocations, kernels
        if clock is not None:
            clock.take()
        runs: dict[int, list[Run]] = {b: [] for b in args.batches}
        for rep in range(args.reps):
            for batch in args.batches:
                done = await backend_run(backend, prompts.take(batch), args.osl, now)
                runs[batch].append((*done, clock.take() if clock is not None else []))
            print(f"  {name}: repetition {rep + 1} of {args.reps} done", flush=True)
        return runs

    rows = []
    for batch, done in asyncio.run(rounds()).items():
        timed = [run for run in done if run[1] is not None]
        if not timed:
            raise RuntimeError(f"{name} batch {batch}: no run timed a step (one part each)")
        tpots = [run[1] for run in timed]
        row = Measured(
            name, batch, min(run[0] for run in done), min(tpots), statistics.median(tpots)
        )
        row.isl = round(statistics.mean(run[2] for run in done))
        row.passes = min(timed, key=lambda run: run[1])[3]
        rows.append(row)
        took = f"TTFT {row.ttft_s * 1e3:.1f} ms, TPOT {row.tpot_s * 1e3:.2f} ms"
        print(f"  {name} batch {batch}: {took} (prompts of {row.isl} tokens)", flush=True)
        if row.passes:
            print(f"    passes (sequences, ms): {_passes(row.passes)}", flush=True)
    return rows


def _passes(passes: list[tuple[int, float]]) -> str:
    """Each pass's sequences and CPU milliseconds, in order."""
    return ", ".join(f"({rows}, {seconds * 1e3:.1f})" for rows, seconds in passes)


def torch_matmul_peak(now: Callable[[], float], dtype: torch.dtype, runs: int = 10) -> float:
    """FLOP/s of torch multiplying two 512 x 512 matrices on its threads: the compute ceiling
    the engine's own kernels reach (a catalog CPU peak at the current clock understates a
    boosting core)."""
    side = 512
    a = torch.ones(side, side, dtype=dtype)
    torch.mm(a, a)  # warm-up: the kernel's choice and buffers
    best = float("inf")
    for _ in range(runs):
        start = now()
        torch.mm(a, a)
        best = min(best, now() - start)
    return 2.0 * side**3 / best


def torch_read_bandwidth(now: Callable[[], float], runs: int = 10) -> float:
    """Bytes/s of torch summing 256 MiB on its threads: the reads the engine makes."""
    data = torch.ones(64 << 20, dtype=torch.float32)
    best = float("inf")
    for _ in range(runs):
        start = now()
        data.sum()
        best = min(best, now() - start)
    return data.numel() * 4 / best
