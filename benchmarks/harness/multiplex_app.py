"""Ray Serve's model multiplexing over a repository of ONNX models: the many-models peer.

Run by benchmarks/multimodel_ray.py (a Ray cluster of its own in this process), no dlscale in
the path. One deployment, one replica (dlscale serves the mix on one device), whose
`@serve.multiplexed(max_num_models_per_replica=N)` loader opens REPO/<model id>/1/model.onnx
with ONNX Runtime under dlscale's CPU session options (one intra-op and one inter-op thread, no
spinning, every graph optimization) and keeps at most N models, least recently used evicted
(ray/serve/multiplex.py, Ray 2.60: one load at a time per replica, under one lock: ray #65346).
The loader builds the session in a worker thread, so requests for loaded models go on meanwhile.

Requests name their model in the `serve_multiplexed_model_id` header (Ray's HTTP proxy routes
on it, ray/serve/_private/proxy.py; the path is not read) and carry an Open Inference Protocol
JSON body: `inputs`, each `name`, `shape`, `datatype` FP32 and flat `data`; every output comes
back the same way. POST /v2/repository/index answers the OIP repository index, READY for the
models the replica holds, so the bench samples this peer as it samples dlscale; GET /loads
says how many loads the replica made and their seconds (the loader's, lock held).

    python -m benchmarks.harness.multiplex_app --repo REPO --port P [--max-models 10] \
        [--max-ongoing 1000]                                                # LISTENING P
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from benchmarks.harness.ray_apps import QUIET, serve_until_stopped

#: dlscale's queue is unbounded (max_queue_size 0): the replica takes whatever is sent, as
#: dlscale does, instead of Ray's default of 5 at a time (the rest waiting in the proxy).
MAX_ONGOING = 1000


def session(path: Path) -> ort.InferenceSession:
    """An ONNX Runtime session with dlscale's CPU backend options (backends/onnxruntime.py)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class Model:
    """One loaded model; it leaves the replica's roster when Ray evicts it (its `__del__`)."""

    def __init__(self, name: str, path: Path, roster: dict[str, Model]) -> None:
        self.name = name
        self.session: ort.InferenceSession | None = session(path)
        self.roster = roster

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """OIP JSON tensors in, OIP JSON tensors out."""
        assert self.session is not None, "evicted"
        feed = {
            t["name"]: np.asarray(t["data"], dtype=np.float32).reshape(t["shape"]) for t in inputs
        }
        names = [o.name for o in self.session.get_outputs()]
        outputs = self.session.run(names, feed)
        return [
            {"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
            for n, a in zip(names, outputs, strict=True)
        ]

    def __del__(self) -> None:
        # Ray calls it at eviction and the collector again later, when a newer load of the same
        # name may hold the roster's entry: only this object's own entry goes.
        if self.roster.get(self.name) is self:
            del self.roster[self.name]
        self.session = None


class Multiplexed:
    """The replica: models loaded on demand by Ray's multiplexing, answered over OIP JSON."""

    def __init__(self, repo: str, max_models: int) -> None:
        self.repo = Path(repo)
        self.roster: dict[str, Model] = {}
        self.load_s: list[float] = []

        async def load(model_id: str) -> Model:
            path = self.repo / model_id / "1" / "model.onnx"
            start = time.perf_counter()
            model = await asyncio.to_thread(Model, model_id, path, self.roster)
            self.load_s.append(time.perf_counter() - start)
            self.roster[model_id] = model
            return model

        # The cap is a run's argument, so the loader is wrapped here; Ray 2.60 detects a
        # multiplexed function stored on the instance (ray/serve/_private/utils.py).
        self.load = serve.multiplexed(max_num_models_per_replica=max_models)(load)

    async def __call__(self, request: Request) -> Any:
        if request.url.path == "/v2/repository/index":
            return self.index()
        if request.url.path == "/loads":
            return {"loads": len(self.load_s), "seconds": sum(self.load_s)}
        model_id = serve.get_multiplexed_model_id()
        if not model_id:
            return _error(400, "no serve_multiplexed_model_id header: which model?")
        if not (self.repo / model_id / "1" / "model.onnx").is_file():
            return _error(404, f"model {model_id!r} is not in the repository")
        try:
            inputs = (await request.json())["inputs"]
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"not an OIP JSON body with inputs: {exc}")
        model = await self.load(model_id)
        try:
            outputs = model.infer(inputs)
        except (ValueError, KeyError, TypeError, InvalidArgument, Fail) as exc:
            return _error(400, f"model {model_id!r} cannot take these inputs: {exc}")
        return {"model_name": model_id, "model_version": "1", "outputs": outputs}

    def index(self) -> list[dict[str, str]]:
        """The repository's models, READY for those loaded on this replica."""
        names = sorted(p.name for p in self.repo.iterdir() if (p / "1" / "model.onnx").is_file())
        return [
            {"name": n, "version": "1", "state": "READY" if n in self.roster else "UNAVAILABLE"}
            for n in names
        ]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-models", type=int, default=10, help="per replica (the budget)")
    parser.add_argument("--max-ongoing", type=int, default=MAX_ONGOING)
    args = parser.parse_args()
    # No CPU asked for: the replica shares the machine's cores, as dlscale's server does.
    deployment = serve.deployment(
        num_replicas=1,
        max_ongoing_requests=args.max_ongoing,
        ray_actor_options={"num_cpus": 0},
        logging_config=QUIET,
        # Stopping between rounds need not wait Ray's default 20 s for requests long answered.
        graceful_shutdown_timeout_s=1,
    )(Multiplexed)
    app = deployment.bind(str(args.repo.resolve()), args.max_models)
    serve_until_stopped(app, "multiplex", args.port, address="local")


if __name__ == "__main__":
    main()
