"""A classic model beside a flood of vLLM streams on one CPU: QoS off, and on (leases).

    dlscale zoo build .bench/zoo --models mlp          # with the [torch] extra (.venv)
    PYTHONPATH=src .venv-vllm/bin/python -m benchmarks.vllm_qos --zoo .bench/zoo [--repeats 2]

One server in this process (dlscale.server.Server, no ports) serves the zoo's llama-tiny on the
vLLM backend (no [qos] of its own: a best-effort tenant of weight 1) and a classic model that
computes on the CPU (the zoo's --model, onnxruntime; requests of --rows rows) with a [qos]
objective. Each repetition
measures, on a server with QoS off (`dlscale serve --no-qos`) and then one with it on (the
engine steps only while it holds a lease of the cpu's slot: docs/qos.md):

- alone (QoS off only): the classic model at --rate requests/s, evenly spaced;
- flood: the same beside --streams closed-loop vLLM streams of --tokens tokens (ignore_eos).

It prints the classic model's p50/p90/p99 per condition, their ratios to the same repetition's
alone phase, and the vLLM tokens/s in each flood, medians over repetitions. Run it with the
interpreter that has the [vllm] extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from dlscale.models.zoo import build_zoo
from dlscale.models.zoo.decoder import LLAMA_TINY
from dlscale.server import Server, ServerSettings
from dlscale.types import InferenceRequest

ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25, "enforce_eager": True}
PROMPT = np.array([b"the device is shared by a classic model and"], dtype=object)


def write_repository(root: Path, model: str, objective_us: int, zoo: Path | None) -> None:
    """llama-tiny on vLLM and the zoo's `model` (copied from `zoo` when given: the zoo's ONNX
    models are built with the [torch] extra, which .venv-vllm lacks) with its [qos] objective."""
    folder = LLAMA_TINY.build(root)
    config = {"name": folder.name, "backend": "vllm", "backend_options": ENGINE}
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    if zoo is not None:
        shutil.copytree(zoo / model, root / model)
    else:
        build_zoo(root, [model])
    with (root / model / "config.toml").open("a") as f:
        f.write(f"\n[qos]\nlatency_objective_us = {objective_us}\n")


async def _classic(
    server: Server, model: str, inputs: dict[str, Any], rate: float, seconds: float
) -> list[float]:
    loop, count = asyncio.get_running_loop(), int(rate * seconds)
    start = loop.time() + 0.05

    async def one(k: int) -> float:
        await asyncio.sleep(start + k / rate + 0.0013 * (k % 7) - loop.time())
        sent = time.perf_counter()
        await server.dataplane.infer(InferenceRequest(model, inputs))
        return time.perf_counter() - sent

    return list(await asyncio.gather(*(one(k) for k in range(count))))


async def _phase(server: Server, args: argparse.Namespace, flood: bool) -> dict[str, float]:
    tokens, stop = [0], asyncio.Event()
    parameters = {"max_tokens": args.tokens, "ignore_eos": True, "temperature": 0.0}

    async def stream() -> None:
        while not stop.is_set():
            request = InferenceRequest(
                LLAMA_TINY.name, {"text_input": PROMPT}, parameters=parameters
            )
            async for response in server.dataplane.stream(request):
                if response.final:
                    tokens[0] += int(response.outputs["num_output_tokens"][0])

    streams = [asyncio.create_task(stream()) for _ in range(args.streams if flood else 0)]
    await asyncio.sleep(1.0 if flood else 0.0)  # the flood is decoding
    before, start = tokens[0], time.perf_counter()
    latencies = await _classic(server, args.model, args.inputs, args.rate, args.duration)
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*streams)
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99]) * 1e3
    return {
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "vllm_tokens_s": (tokens[0] - before) / elapsed if flood else float("nan"),
        "load_1m": os.getloadavg()[0],
    }


async def repetition(root: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    phases = {}
    for qos in (False, True):
        settings = ServerSettings.build(
            root, http_port=None, grpc_port=None, metrics_port=None, qos=qos
        )
        server = Server(settings)
        await server.start()
        await server.wait_loaded()
        try:
            if not qos:
                phases["alone"] = await _phase(server, args, flood=False)
            phases["on" if qos else "off"] = await _phase(server, args, flood=True)
        finally:
            await server.stop()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="the zoo's classic model")
    parser.add_argument("--rows", type=int, default=64, help="rows of each classic request")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds a phase")
    parser.add_argument("--rate", type=float, default=2.0, help="classic requests/s")
    parser.add_argument("--objective-us", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--zoo", type=Path, help="a folder with --model built (dlscale zoo build)")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_repository(root, args.model, args.objective_us, args.zoo)
        args.inputs = _inputs(root, args.model, args.rows)
        for _ in range(args.repeats):
            runs.append(asyncio.run(repetition(root, args)))
            print(json.dumps(runs[-1]), flush=True)
    for name in ("alone", "off", "on"):
        row = {f: statistics.median(r[name][f] for r in runs) for f in runs[0][name]}
        ratio = {
            f"{f}/alone": statistics.median(r[name][f] / r["alone"][f] for r in runs)
            for f in ("p50_ms", "p90_ms", "p99_ms")
        }
        print(name, json.dumps({k: round(v, 2) for k, v in {**row, **ratio}.items()}))


def _inputs(root: Path, model: str, rows: int) -> dict[str, Any]:
    """One request's inputs for the zoo model (`rows` rows), from its config's first input."""
    config = tomllib.loads((root / model / "config.toml").read_text())
    spec = config["inputs"][0]
    shape = [rows, *[d if d > 0 else 1 for d in spec["shape"]]]
    return {spec["name"]: np.random.default_rng(0).random(shape, dtype=np.float32)}


if __name__ == "__main__":
    main()
