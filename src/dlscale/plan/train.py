"""Training-time planner: compute from FLOPs and achieved utilization, plus exposed all-reduce time.

Data-parallel training: each step every GPU computes `batch_per_gpu` samples, then the gradients
are all-reduced. Communication may overlap the backward pass, which is two thirds of a step's
compute (backward costs about twice the forward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dlscale.errors import PlanError
from dlscale.plan.collective import Algorithm, Estimate, Topology, allreduce, available

#: Share of a step's compute spent in the backward pass (backward ≈ 2 × forward FLOPs).
BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class TrainingJob:
    """What is trained: training FLOPs (forward + backward) and input bytes per sample."""

    flops_per_sample: float
    samples: int
    epochs: float = 1.0
    gradient_bytes: float = 0.0
    batch_per_gpu: int = 32
    bytes_per_sample: float = 0.0

    def __post_init__(self) -> None:
        if self.flops_per_sample <= 0 or self.samples <= 0 or self.epochs <= 0:
            raise PlanError("FLOPs per sample, samples and epochs must be positive")
        if self.batch_per_gpu < 1 or self.gradient_bytes < 0 or self.bytes_per_sample < 0:
            raise PlanError("batch per GPU must be >= 1; byte counts must be non-negative")

    @property
    def total_flops(self) -> float:
        """FLOPs of the whole run."""
        return self.flops_per_sample * self.samples * self.epochs

    @property
    def total_bytes(self) -> float:
        """Input bytes read over the whole run."""
        return self.bytes_per_sample * self.samples * self.epochs


@dataclass(frozen=True)
class Cluster:
    """Where it runs: the topology, each GPU's peak at the training precision, and the MFU."""

    topology: Topology
    peak_flops: float
    mfu: float = 0.4
    overlap: float = 0.0

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or not 0 < self.mfu <= 1:
            raise PlanError("peak FLOP/s must be positive and MFU in (0, 1]")
        if not 0 <= self.overlap <= 1:
            raise PlanError(f"overlap must be in [0, 1], got {self.overlap}")


@dataclass(frozen=True)
class TrainingPlan:
    """Per-step and whole-run times of one job on one cluster with one all-reduce algorithm."""

    gpus: int
    steps: int
    compute_s: float
    allreduce: Estimate
    exposed_comm_s: float
    total_flops: float
    total_bytes: float

    @property
    def step_s(self) -> float:
        """Seconds per step: compute plus the communication not hidden behind it."""
        return self.compute_s + self.exposed_comm_s

    @property
    def total_s(self) -> float:
        """Seconds for the whole run."""
        return self.steps * self.step_s

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: the share of a step spent computing (1 = linear scaling)."""
        return self.compute_s / self.step_s

    @property
    def sustained_flops(self) -> float:
        """FLOP/s the cluster sustains over the run."""
        return self.total_flops / self.total_s

    @property
    def data_bandwidth(self) -> float:
        """Bytes/s of input the data pipeline must deliver to keep up."""
        return self.total_bytes / self.total_s


def plan_training(
    job: TrainingJob, cluster: Cluster, algorithm: Algorithm | str = "auto"
) -> TrainingPlan:
    """How long `job` takes on `cluster` with data-parallel all-reduce of the gradients."""
    gpus = cluster.topology.ranks
    steps = math.ceil(job.samples * job.epochs / (job.batch_per_gpu * gpus))
    compute = job.batch_per_gpu * job.flops_per_sample / (cluster.peak_flops * cluster.mfu)
    comm = allreduce(job.gradient_bytes, cluster.topology, algorithm)
    hidden = min(comm.seconds, cluster.overlap * BACKWARD_SHARE * compute)
    return TrainingPlan(
        gpus, steps, compute, comm, comm.seconds - hidden, job.total_flops, job.total_bytes
    )


def scaling_sizes(topology: Topology, max_nodes: int | None = None) -> list[tuple[int, int]]:
    """(GPUs per node, nodes) from one GPU to `max_nodes` full nodes, doubling each time.

    Without an inter-node fabric the sizes stop at one full node.
    """
    g = topology.gpus_per_node
    top = max_nodes or max(16, 4 * topology.nodes)
    if topology.inter is None:
        top = 1
    sizes = [(k, 1) for k in (1 << i for i in range(g.bit_length())) if k < g]
    return sizes + [(g, 1 << i) for i in range(top.bit_length())]  # nodes 1, 2, 4 ... <= top


def scaling_curves(
    job: TrainingJob,
    cluster: Cluster,
    algorithms: Sequence[Algorithm] = (Algorithm.RING, Algorithm.TREE),
    max_nodes: int | None = None,
) -> dict[Algorithm, list[TrainingPlan]]:
    """For each algorithm, the plan at each size where the algorithm applies."""
    curves: dict[Algorithm, list[TrainingPlan]] = {a: [] for a in algorithms}
    for g, nodes in scaling_sizes(cluster.topology, max_nodes):
        topo = replace(cluster.topology, gpus_per_node=g, nodes=nodes)  # the same fabrics
        sized = replace(cluster, topology=topo)
        for a in algorithms:
            if topo.ranks == 1 or a in available(topo):
                curves[a].append(plan_training(job, sized, a))
    return curves


@dataclass(frozen=True)
class Requirement:
    """What finishing a run by a deadline takes: sustained FLOP/s and input bytes/s."""

    seconds: float
    flops_per_s: float
    bytes_per_s: float

    def gpus(self, peak_flops: float, mfu: float) -> int:
        """GPUs of `peak_flops` at `mfu` needed for that rate, communication aside."""
        return math.ceil(self.flops_per_s / (peak_flops * mfu))


def requirement(total_flops: float, total_bytes: float, seconds: float) -> Requirement:
    """The sustained compute and data rates that finish `total_flops` in `seconds`."""
    if seconds <= 0:
        raise PlanError(f"deadline must be positive, got {seconds} s")
    return Requirement(seconds, total_flops / seconds, total_bytes / seconds)
