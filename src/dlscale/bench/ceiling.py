"""The client's own ceiling: the same requests against a dlscale null server that computes nothing.

A short Offline run with the measured run's protocol, tensors, batch, concurrency and workers,
against `dlscale serve` in a child process over a repository holding one null-backend model
(src/dlscale/backends/null.py) that declares the same inputs and outputs: its answers are the
size the real model's are, and it takes no time to compute them. What that run reaches is what
this client (and this host, which the null server shares) can drive; a server measured near it
may be faster than the figure says. The bench talks to the null server over the network as to
any server, so it needs none of the server's code.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions, opened
from dlscale.bench.targets import ModelInfo
from dlscale.bench.tenants import TenantServer
from dlscale.errors import BenchError
from dlscale.types import Datatype, TensorSpec

#: The calibration run's minimum duration at most (shorter when the bench's runs are).
CALIBRATION_S = 3.0
#: A run reaching this share of the ceiling measured the client, not the server.
SATURATED_SHARE = 0.8
#: Seconds the null server may take to start.
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Ceiling:
    """What the calibration run reached, how it was measured, or why it could not be."""

    throughput: float | None
    method: str
    request_p50_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {
            "samples_per_s": self.throughput,
            "request_p50_s": self.request_p50_s,
            "method": self.method,
            "saturated_share": SATURATED_SHARE,
            "error": self.error,
        }

    def bound(self, throughput: float | None) -> bool | None:
        """Whether a run's throughput is at or near the ceiling (None: no ceiling to say)."""
        if not self.throughput or throughput is None:
            return None
        return throughput >= SATURATED_SHARE * self.throughput


def measure(
    url: str, info: ModelInfo, options: BenchOptions, batch: int, concurrency: int, log_dir: Path
) -> Ceiling:
    """The ceiling for requests like the run's (a failure is reported, never raised)."""
    scheme = "grpc" if url.startswith("grpc://") else "http"
    seconds = min(options.duration_s, CALIBRATION_S)
    method = (
        f"Offline {seconds:g} s against a null-backend dlscale server in a child process on "
        f"this host: {scheme}, batch {batch}, concurrency {concurrency}, "
        f"workers {options.workers or 'none (in process)'}"
    )
    calibration = replace(
        options,
        scenarios=[Scenario.OFFLINE],
        repo=None,
        version="",
        duration_s=seconds,
        warmup_s=min(options.warmup_s, 1.0),
        find_peak=False,
        target_qps=None,
        accuracy=False,
        reference=None,
        official=False,
        batch_size=batch,
        concurrency=concurrency,
        concurrency_sweep=(),
        min_query_count=None,
        progress=False,
        client_ceiling=False,
    )
    try:
        with (
            null_server(info, batch, options.shared_memory != "none") as ports,
            opened(f"{scheme}://{ports[scheme]}", calibration) as session,
        ):
            run, _ = session.sized_run(session.settings(Scenario.OFFLINE), log_dir)
    except (BenchError, OSError) as exc:
        return Ceiling(None, method, error=str(exc))
    p50 = float(np.median(run.request_ns)) / 1e9 if len(run.request_ns) else None
    if not run.valid:
        return Ceiling(run.throughput, method, p50, "; ".join(run.reasons))
    return Ceiling(run.throughput, method, p50)


def null_config(info: ModelInfo, batch: int) -> str:
    """config.toml of a null model with the tensors of `info` (its answers are as large)."""
    max_batch = (info.max_batch_size or batch) if info.batched else 0
    lines = ['backend = "null"', f"max_batch_size = {max_batch}"]
    if info.batched:
        lines += ["[batching]", "max_queue_delay_us = 0"]
    skip = 1 if info.batched else 0
    for table, specs in (("inputs", info.inputs), ("outputs", info.outputs)):
        for spec in specs:
            shape = ", ".join(str(d) for d in spec.shape[skip:])
            lines += [
                f"[[{table}]]",
                f'name = "{spec.name}"',
                f'datatype = "{spec.datatype.value}"',
                f"shape = [{shape}]",
            ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def null_server(info: ModelInfo, batch: int, client_shm: bool = False) -> Iterator[dict[str, str]]:
    """`dlscale serve` over a null model like `info` on free ports; yields {protocol: HOST:PORT}.
    With `client_shm` it takes clients' shared-memory regions, as the measured run's server."""
    with tempfile.TemporaryDirectory(prefix="dlscale-ceiling-") as tmp:
        root = Path(tmp) / "repo"
        (root / info.name / "1").mkdir(parents=True)
        (root / info.name / "1" / "model.null").touch()
        (root / info.name / "config.toml").write_text(null_config(info, batch))
        mib = str(max(64, 4 * _request_bytes(info, batch) // 2**20))
        flags = ["--grpc-port", "0", "--log-level", "INFO", "--max-body-mb", mib,
                 "--max-grpc-mb", mib, *(["--allow-client-shm"] if client_shm else [])]  # fmt: skip
        with TenantServer(root, None, Path(tmp) / "serve.log", START_TIMEOUT_S, flags) as server:
            server.wait_ready(START_TIMEOUT_S)
            yield server.addresses()


def _request_bytes(info: ModelInfo, batch: int) -> int:
    rows = batch if info.batched else 1
    specs: tuple[TensorSpec, ...] = info.sample_specs()
    per_row = sum(
        max(s.datatype.itemsize, 1) * int(np.prod([max(d, 1) for d in s.shape]))
        for s in specs
        if s.datatype is not Datatype.BYTES
    )
    return rows * per_row


def mark(report: dict[str, Any], ceiling: Ceiling) -> None:
    """Put the ceiling in the report and mark each run (and sweep point) bound by it or not."""
    headline = 0.0
    for entry in report["scenarios"]:
        res = entry.get("result")
        if res is not None:
            res["client_bound"] = ceiling.bound(res["throughput_samples_per_s"])
            headline = max(headline, res["throughput_samples_per_s"] or 0.0)
        for point in entry.get("sweep", []):
            point["client_bound"] = ceiling.bound(point["throughput_samples_per_s"])
    out = ceiling.to_dict()
    out["headline_share"] = headline / ceiling.throughput if ceiling.throughput else None
    report["client_ceiling"] = out
