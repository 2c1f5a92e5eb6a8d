"""Two Ray Serve replicas of unequal speed behind Ray's HTTP proxy and its default router.

Run by benchmarks/routing.py (a Ray cluster of its own in this process), no dlscale in the
path: one deployment of two replicas, each a simulated device that sleeps per batch of up to 4
rows, one batch at a time, the batch formed from the requests waiting when the device frees (no
wait to fill), as dlscale's batcher does for the null model. Not `@serve.batch`: its loop forms
the next batch as soon as the previous one starts and only then waits for the device
(`_process_batches` in ray/serve/batching.py, Ray 2.60), so with no wait to fill its batches
hold one or two rows and the replica serves a fraction of the null model's rate.
The replica of rank 0 takes `--fast-ms` per batch, the other `--slow-ms`. The request and the
answer are the Open Inference Protocol's JSON ([1, 16] FP32, echoed). Everything else is Ray's
default: the power-of-two-choices router, `max_ongoing_requests` 5 per replica (or
`--max-ongoing`, so that the cap does not bind and only the choice of replica is compared).

    python -m benchmarks.harness.ray_unequal --port P --fast-ms 50 --slow-ms 150 \
        [--max-ongoing N]                                                         # LISTENING P
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from ray import serve

from benchmarks.harness.ray_apps import QUIET, serve_until_stopped

#: No access log line per request (Ray's default logs every call); replicas ask for no CPU.
MAX_BATCH = 4


@serve.deployment(
    num_replicas=2, ray_actor_options={"num_cpus": 0}, logging_config=QUIET
)  # fmt: skip
class Sleeper:
    """An OIP infer call echoed after the replica's time per batch."""

    def __init__(self, fast_s: float, slow_s: float) -> None:
        rank = serve.get_replica_context().rank.rank
        self.delay_s = fast_s if rank == 0 else slow_s
        self.queue: asyncio.Queue[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = (
            asyncio.Queue()
        )
        self.device: asyncio.Task[None] | None = None

    async def __call__(self, request: Any) -> dict[str, Any]:
        tensor = (await request.json())["inputs"][0]
        if self.device is None:
            self.device = asyncio.create_task(self.run())
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await self.queue.put(({**tensor, "name": "output"}, answer))
        return {"model_name": "sleeper", "outputs": [await answer]}

    async def run(self) -> None:
        """The device: one batch at a time, formed from what waits once it is free."""
        while True:
            batch = [await self.queue.get()]
            while len(batch) < MAX_BATCH and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            await asyncio.sleep(self.delay_s)  # holds no CPU
            for tensor, answer in batch:
                answer.set_result(tensor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fast-ms", type=float, required=True)
    parser.add_argument("--slow-ms", type=float, required=True)
    parser.add_argument("--max-ongoing", type=int, default=None, help="Ray's default if unset")
    args = parser.parse_args()
    deployment = Sleeper
    if args.max_ongoing is not None:
        deployment = Sleeper.options(max_ongoing_requests=args.max_ongoing)
    app = deployment.bind(args.fast_ms / 1e3, args.slow_ms / 1e3)
    serve_until_stopped(app, "unequal", args.port, address="local")


if __name__ == "__main__":
    main()
