"""`dlscale run`: a model's in-process latency at batch 1 and throughput at batch N, no server."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from dlscale.backends import Backend, BackendOptions, create_backend
from dlscale.errors import InvalidInput
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelVersion
from dlscale.models.samples import inputs_for
from dlscale.models.signature import reconcile


@dataclass(frozen=True)
class Timing:
    """Repeated runs of one batch: per-run seconds and what follows from them."""

    batch: int
    seconds: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1e3

    @property
    def p90_ms(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3

    @property
    def throughput(self) -> float:
        """Samples per second at the median run time."""
        return self.batch / statistics.median(self.seconds)


def time_backend(
    backend: Backend,
    inputs: dict[str, np.ndarray],
    *,
    min_seconds: float = 1.0,
    min_runs: int = 3,
    max_runs: int = 1000,
) -> Timing:
    """Run one batch repeatedly after a warm-up run; at least min_runs and min_seconds."""
    batch = next(iter(inputs.values())).shape[0]
    backend.infer(inputs)
    runs: list[float] = []
    start = time.perf_counter()
    while len(runs) < max_runs and (
        len(runs) < min_runs or time.perf_counter() - start < min_seconds
    ):
        t0 = time.perf_counter()
        backend.infer(inputs)
        runs.append(time.perf_counter() - t0)
    return Timing(batch, tuple(runs))


def options_for(config: ModelConfig, device: str = "cpu") -> BackendOptions:
    """What a backend of `config` on `device` is built with: its [backend_options] and tensors."""
    opts = config.backend_options
    return BackendOptions(
        device=device,
        intra_op_threads=opts.intra_op_threads,
        inter_op_threads=opts.inter_op_threads,
        max_batch_size=config.max_batch_size,
        graph_optimization_level=opts.graph_optimization_level,
        extra=dict(opts.model_extra or {}),
        # Runtimes without a model file to read them from (null, python) serve these.
        inputs=tuple(config.tensor_specs("inputs") or ()),
        outputs=tuple(config.tensor_specs("outputs") or ()),
    )


def load_for_run(version: ModelVersion, device: str = "cpu") -> Backend:
    """Load a model version's backend as the server would (options from its config)."""
    backend = create_backend(
        version.config.backend, version.model_file, options_for(version.config, device)
    )
    backend.load()
    return backend


def run_model(
    version: ModelVersion, batch: int, *, min_seconds: float = 1.0, seed: int = 0
) -> tuple[Timing, Timing]:
    """(batch-1 timing, batch-N timing) of one model version on the CPU."""
    backend = load_for_run(version)
    try:
        inputs, _ = reconcile(version.config, backend.inputs, backend.outputs, version.source)
        rng = np.random.default_rng(seed)

        def timed(rows: int) -> Timing:
            try:
                feed = inputs_for(version.name, version.path, inputs, rows, rng)
            except MemoryError:  # numpy refuses the allocation before making it
                raise InvalidInput(
                    f"a batch of {rows} does not fit in this host's memory"
                ) from None
            return time_backend(backend, feed, min_seconds=min_seconds)

        return timed(1), timed(batch)
    finally:
        backend.unload()
