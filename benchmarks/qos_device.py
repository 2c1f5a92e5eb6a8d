"""QoS on a simulated device: a protected model beside a flooding neighbor, QoS off and on.

    python -m benchmarks.qos_device --repeats 2 --duration 12

Both models are null-backend models whose batches hold one simulated device (docs/backends.md:
`simulated_device`): sleeps, so the device's time costs no CPU and the host's noise stays out
of it, as an accelerator's kernels would. `protected` takes 100 ms a request with an objective
of 120 ms (1.2x its service time), at --rate 2/s: 20% of the device; `neighbor` takes 0.2 ms +
0.5 ms a row, batches of up to 256 rows (128 ms), sent as requests of 32 rows (16 ms: a request
is never split, so that is the least a neighbor batch blocks) by 16 closed-loop clients. The
times are long because the host's own work per batch (a few milliseconds on a loaded 2-core
machine) must stay small beside them. Each repetition serves the repository in process
(dlscale.server.Server, no ports) and measures:

- alone: the protected model at --rate (evenly spaced, slightly irregular), then the neighbor;
- off: both at once on a server with QoS off (`dlscale serve --no-qos`): the device is shared
  first come first served;
- on: both at once with the device scheduler on (docs/qos.md).

It prints per condition the medians over repetitions of the protected p90 and p99, their
ratios to the same repetition's alone phase, and the neighbor's rows/s as a share of the rate
left to it: its rate alone x (1 - the protected model's share of the device, rate x 100 ms).
Targets with QoS on: p99 ratio at most 1.2, share at least 0.8. Imports only dlscale and
the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.server import Server, ServerSettings
from dlscale.types import InferenceRequest

PROTECTED_US = 100_000
OBJECTIVE_US = 120_000
NEIGHBOR_US, NEIGHBOR_ROW_US, NEIGHBOR_BATCH, NEIGHBOR_ROWS = 200, 500, 256, 32
FLOOD_CLIENTS = 2 * NEIGHBOR_BATCH // NEIGHBOR_ROWS
TENSORS = (
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [4]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [4]\n'
)


def write_repository(root: Path, device: str = "bench-sim") -> Path:
    """The two models on one simulated device; the protected one with its [qos] objective."""
    models = {
        "protected": f"max_batch_size = 1\n{TENSORS}[backend_options]\ndelay_us = {PROTECTED_US}\n"
        f'simulated_device = "{device}"\n[qos]\nlatency_objective_us = {OBJECTIVE_US}\n',
        "neighbor": f"max_batch_size = {NEIGHBOR_BATCH}\n{TENSORS}[backend_options]\n"
        f"delay_us = {NEIGHBOR_US}\ndelay_us_per_row = {NEIGHBOR_ROW_US}\n"
        f'simulated_device = "{device}"\n',
    }
    for name, config in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.null").touch()
        (root / name / "config.toml").write_text('backend = "null"\n' + config)
    return root


@dataclass(frozen=True)
class Phase:
    """One condition of one repetition."""

    p90_ms: float  # protected p90 (nan when the protected model did not run)
    p99_ms: float  # protected p99 (nan when the protected model did not run)
    neighbor_rows_s: float  # neighbor rows per second (nan when it did not run)


async def _protected(server: Server, rate: float, duration: float) -> list[float]:
    loop, count = asyncio.get_running_loop(), int(rate * duration)
    start, row = loop.time() + 0.05, {"x": np.ones((1, 4), np.float32)}

    async def one(k: int) -> float:
        await asyncio.sleep(start + k / rate + 0.0013 * (k % 7) - loop.time())
        sent = time.perf_counter()
        await server.dataplane.infer(InferenceRequest("protected", row))
        return time.perf_counter() - sent

    return list(await asyncio.gather(*(one(k) for k in range(count))))


async def _phase(server: Server, rate: float, duration: float, flood: bool, guard: bool) -> Phase:
    """The protected model at `rate` for `duration` (`guard`), beside the flood (`flood`)."""
    rows, stop = [0], asyncio.Event()
    batch = {"x": np.ones((NEIGHBOR_ROWS, 4), np.float32)}

    async def client() -> None:
        while not stop.is_set():
            await server.dataplane.infer(InferenceRequest("neighbor", batch))
            rows[0] += NEIGHBOR_ROWS

    clients = [asyncio.create_task(client()) for _ in range(FLOOD_CLIENTS if flood else 0)]
    await asyncio.sleep(0.5 if flood else 0.0)  # the flood reaches full batches
    before, start = rows[0], time.perf_counter()
    latencies = await _protected(server, rate, duration) if guard else []
    if not guard:
        await asyncio.sleep(duration)
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*clients)
    p90, p99 = np.percentile(latencies, [90, 99]) * 1e3 if latencies else (np.nan, np.nan)
    return Phase(float(p90), float(p99), (rows[0] - before) / elapsed if flood else np.nan)


async def _serve(root: Path, qos: bool) -> Server:
    settings = ServerSettings.build(
        root, http_port=None, grpc_port=None, metrics_port=None, qos=qos
    )
    server = Server(settings)
    await server.start()
    await server.wait_loaded()
    return server


async def repetition(root: Path, rate: float, duration: float) -> dict[str, Phase]:
    """alone (protected, then neighbor), off and on: one repetition's phases."""
    phases = {}
    off = await _serve(root, qos=False)
    try:
        phases["alone"] = await _phase(off, rate, duration, flood=False, guard=True)
        phases["neighbor alone"] = await _phase(off, rate, duration / 2, flood=True, guard=False)
        phases["off"] = await _phase(off, rate, duration, flood=True, guard=True)
    finally:
        await off.stop()
    on = await _serve(root, qos=True)
    try:
        phases["on"] = await _phase(on, rate, duration, flood=True, guard=True)
    finally:
        await on.stop()
    return phases


def report(runs: list[dict[str, Phase]], rate: float) -> str:
    """The table: medians over repetitions of each condition's figures."""
    share = rate * PROTECTED_US / 1e6
    lines = [
        "| condition | protected p90 (ms) | p90 / alone | protected p99 (ms) | p99 / alone "
        "| neighbor rows/s | neighbor kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("alone", "off", "on"):
        p90 = statistics.median(r[name].p90_ms for r in runs)
        ratio90 = statistics.median(r[name].p90_ms / r["alone"].p90_ms for r in runs)
        p99 = statistics.median(r[name].p99_ms for r in runs)
        ratio = statistics.median(r[name].p99_ms / r["alone"].p99_ms for r in runs)
        if name == "alone":
            rows = statistics.median(r["neighbor alone"].neighbor_rows_s for r in runs)
            kept_text = "(alone)"
        else:
            rows = statistics.median(r[name].neighbor_rows_s for r in runs)
            kept = statistics.median(
                r[name].neighbor_rows_s / (r["neighbor alone"].neighbor_rows_s * (1 - share))
                for r in runs
            )
            kept_text = f"{kept:.2f}"
        lines.append(
            f"| {name} | {p90:.1f} | {ratio90:.2f} | {p99:.1f} | {ratio:.2f} | {rows:,.0f} "
            f"| {kept_text} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Parse the options, run the repetitions, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds a phase")
    parser.add_argument("--rate", type=float, default=2.0, help="protected requests/s")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        root = write_repository(Path(scratch))
        for k in range(args.repeats):
            runs.append(asyncio.run(repetition(root, args.rate, args.duration)))
            phases = ", ".join(
                f"{n} p90 {p.p90_ms:.1f} ms, p99 {p.p99_ms:.1f} ms, {p.neighbor_rows_s:,.0f} rows/s"
                for n, p in runs[-1].items()
            )
            print(f"repetition {k + 1}: {phases}", flush=True)
    print(report(runs, args.rate))


if __name__ == "__main__":
    main()
