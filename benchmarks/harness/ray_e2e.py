"""The JPEG -> top-5 pipeline as Ray Serve composed deployments, written the natural way.

Run by servers.start_ray_e2e (a Ray cluster of its own in this process): an HTTP ingress
deployment takes the JPEG as the request body, awaits the Decode deployment through its handle,
then the Classify deployment (model and top 5) through its handle, and answers the labels as
JSON. Decode and Classify batch with `@serve.batch` at the same largest batch and wait as
dlscale's steps, and accept as many requests at once as a batch holds (Ray's default of 5 would
cap a batch at 5). The work is e2e_apps.Classifier's, the same as dlscale's pipeline.

    python -m benchmarks.harness.ray_e2e --repo REPO --port P      # prints LISTENING P
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from benchmarks.harness.e2e_apps import MAX_BATCH, QUEUE_DELAY_US, Classifier, E2ESpec
from benchmarks.harness.ray_apps import QUIET, serve_until_stopped

#: No access log line per request (Ray's default logs every call), as `dlscale serve --ray`
#: deploys too; replicas ask for no CPU: all share the machine's cores, as dlscale's steps do
#: (the asks would only decide whether Ray agrees to place them on 2 cores).
OPTIONS: dict[str, Any] = {"ray_actor_options": {"num_cpus": 0}, "logging_config": QUIET}
WAIT_S = QUEUE_DELAY_US / 1e6


@serve.deployment(max_ongoing_requests=MAX_BATCH, **OPTIONS)
class Decode:
    """JPEG bytes -> normalized pixels, a batch at a time."""

    def __init__(self, spec: E2ESpec) -> None:
        self.classifier = Classifier(spec)

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def __call__(self, jpegs: list[bytes]) -> list[np.ndarray]:
        return [self.classifier.decode(j) for j in jpegs]


@serve.deployment(max_ongoing_requests=MAX_BATCH, **OPTIONS)
class Classify:
    """Pixels -> the top 5, a batch at a time."""

    def __init__(self, spec: E2ESpec) -> None:
        self.classifier = Classifier(spec)

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def __call__(self, pixels: list[np.ndarray]) -> list[list[str]]:
        top = self.classifier.classify(np.stack(pixels))
        return [[label.decode() for label in row] for row in top]


@serve.deployment(max_ongoing_requests=4 * MAX_BATCH, **OPTIONS)
class Ingress:
    """POST / with a JPEG body -> {"labels": [...]}: decode, then classify, through handles."""

    def __init__(self, decode: DeploymentHandle, classify: DeploymentHandle) -> None:
        self.decode = decode
        self.classify = classify

    async def __call__(self, request: Any) -> dict[str, list[str]]:
        pixels = await self.decode.remote(await request.body())
        return {"labels": await self.classify.remote(pixels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    spec = E2ESpec.read(args.repo.resolve())
    serve_until_stopped(Ingress.bind(Decode.bind(spec), Classify.bind(spec)), "e2e", args.port)


if __name__ == "__main__":
    main()
