"""What a vLLM engine's lease costs under [qos]: its pause and resume round trips.

    PYTHONPATH=src .venv-vllm/bin/python -m benchmarks.vllm_pause [--times 20] [--streams 8]

Under [qos] a vLLM engine steps only while it holds a lease of its device's slot and is paused
between leases (serving/qos/leases.py, docs/qos.md): each lease costs one pause (vLLM's "keep"
pause, which answers once the step in flight has ended) and one resume. This loads the zoo's
llama-tiny on the vLLM backend and times --times pause/resume pairs with the engine idle, then
with --streams greedy streams running, and prints the medians and maxima in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dlscale.backends import BackendOptions
from dlscale.backends.generative.vllm import VllmBackend
from dlscale.models.zoo.decoder import LLAMA_TINY
from dlscale.sampling import Sampling

ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25, "enforce_eager": True}
PROMPT = np.array([b"the device is shared by"], dtype=object)


async def round_trips(engine: VllmBackend, times: int) -> list[tuple[float, float]]:
    """(pause s, resume s) for each of `times` pairs, 10 ms apart."""
    pairs = []
    for _ in range(times):
        start = time.perf_counter()
        await engine.pause()
        paused = time.perf_counter()
        await engine.resume()
        pairs.append((paused - start, time.perf_counter() - paused))
        await asyncio.sleep(0.01)
    return pairs


async def stream(engine: VllmBackend, index: int) -> None:
    sampling = Sampling.from_parameters({"max_tokens": 200, "ignore_eos": True})
    async for _ in engine.generate(str(index), {"text_input": PROMPT}, sampling):
        pass


def report(name: str, pairs: list[tuple[float, float]]) -> None:
    pause, resume = [p * 1e3 for p, _ in pairs], [r * 1e3 for _, r in pairs]
    print(
        f"{name}: pause p50 {statistics.median(pause):.2f} ms, max {max(pause):.2f}; "
        f"resume p50 {statistics.median(resume):.2f} ms, max {max(resume):.2f}"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as root:
        folder = LLAMA_TINY.build(Path(root))
        options = BackendOptions(device="cpu", extra=dict(ENGINE))
        engine = VllmBackend(folder / "1" / "config.json", options)
        await asyncio.to_thread(engine.load)
        try:
            report("idle", await round_trips(engine, args.times))
            streams = [asyncio.create_task(stream(engine, i)) for i in range(args.streams)]
            await asyncio.sleep(0.5)  # the streams are decoding
            report(f"{args.streams} streams", await round_trips(engine, args.times))
            await asyncio.gather(*streams)
        finally:
            engine.unload()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--times", type=int, default=20)
    parser.add_argument("--streams", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
