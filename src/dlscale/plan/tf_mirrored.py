"""TensorFlow MirroredStrategy on virtual CPU devices, beside the cost model and the planner.

The gloo run (allreduce_bench.py) times all-reduce between processes over TCP loopback; this
one times it between the replicas of one TensorFlow process, each a logical CPU device, and
trains a small dense model on 1 and on N replicas. The fabric the model assumes is host memory,
measured in the same child process (copy bandwidth of 32 MiB; an empty replicated call's cost as
the fixed cost per call). TensorFlow runs in a child process (tf_mirrored_worker.py): logical
devices must be set before TensorFlow starts, and the caller's process stays free of it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dlscale.errors import PlanError
from dlscale.native import run_child, stderr_tail
from dlscale.plan.allreduce_bench import BenchReport, bench_row
from dlscale.plan.collective import Fabric, Topology, loopback
from dlscale.plan.train import Cluster, TrainingJob, plan_training

BACKEND = "tf-mirrored"
#: Seconds a child run may take (TensorFlow starts in ~5 s; the runs are short).
TIMEOUT_S = 600


def _child(job: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "dlscale.plan.tf_mirrored_worker", json.dumps(job)]
    done = run_child(command, TIMEOUT_S, PlanError, f"the TensorFlow run took over {TIMEOUT_S} s")
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        if "No module named 'tensorflow'" in done.stderr:
            raise PlanError(
                "the tf-mirrored run needs TensorFlow: pip install 'dlscale[tensorflow]'"
            )
        raise PlanError(f"the TensorFlow run failed: {stderr_tail(done)}")
    result: dict[str, Any] = json.loads(found[-1][len("RESULT ") :])
    return result


def host_memory(measured: dict[str, float]) -> Fabric:
    """The fabric between logical CPU devices: host memory, at the measured figures."""
    fabric = loopback(measured["bandwidth"], step_latency_s=0.0, base_latency_s=measured["call_s"])
    return replace(
        fabric,
        name="host-memory",
        note=(
            f"logical CPU devices of one process: copy bandwidth {measured['bandwidth'] / 1e9:.2f}"
            f" GB/s, {measured['call_s'] * 1e6:.0f} us per replicated call, measured here; "
            "ring all-reduce assumed (MirroredStrategy reduces to one device on CPUs)"
        ),
    )


def run_allreduce(nproc: int, sizes: Sequence[int], iters: int, warmup: int) -> BenchReport:
    """Time MirroredStrategy's all-reduce over `nproc` logical CPU devices beside the model."""
    if nproc < 2 or iters < 1 or warmup < 0:
        raise PlanError("an all-reduce benchmark needs --nproc >= 2 and --iters >= 1")
    job = {"kind": "allreduce", "nproc": nproc, "sizes": list(sizes)}
    raw = _child(job | {"iters": iters, "warmup": warmup})
    fabric = host_memory(raw["fabric"])
    topology = Topology(gpus_per_node=nproc, nodes=1, intra=fabric)
    rows = [bench_row(r["nbytes"], r["times"], topology) for r in raw["rows"]]
    return BenchReport(BACKEND, nproc, iters, fabric.name, fabric.note, rows, raw["checked"])


@dataclass(frozen=True)
class TrainingCheck:
    """A data-parallel step measured on N replicas, and the planner's prediction of it."""

    replicas: int
    batch_per_replica: int
    params: int
    #: Measured: one replica's step (the compute the planner is calibrated with), N replicas'.
    step_one_s: float
    step_many_s: float
    predicted_s: float
    predicted_comm_s: float
    fabric_note: str

    @property
    def ratio(self) -> float:
        """Measured over predicted (1: the planner is exact)."""
        return self.step_many_s / self.predicted_s


def check_training(replicas: int, steps: int = 20, batch: int = 64) -> TrainingCheck:
    """Train a dense model with MirroredStrategy; the planner predicts the N-replica step from
    the 1-replica step (its compute) and the gradients' all-reduce over the measured fabric."""
    if replicas < 2 or steps < 1:
        raise PlanError("a MirroredStrategy check needs >= 2 replicas and >= 1 step")
    raw = _child({"kind": "train", "nproc": replicas, "steps": steps, "batch": batch})
    one, many = raw["1"], raw[str(replicas)]
    fabric = host_memory(raw["fabric"])
    params = int(raw["params"])
    flops = 6.0 * params  # forward 2 FLOPs per weight, backward twice that
    job = TrainingJob(flops, batch * replicas, 1.0, 4.0 * params, batch)
    # The peak that makes the planner's compute per step equal the measured 1-replica step.
    cluster = Cluster(Topology(replicas, 1, fabric), flops * batch / one, 1.0, 0.0)
    plan = plan_training(job, cluster, "ring")
    return TrainingCheck(
        replicas, batch, params, one, many, plan.step_s, plan.exposed_comm_s, fabric.note
    )
