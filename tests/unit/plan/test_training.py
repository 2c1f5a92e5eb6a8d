"""The training-time planner: the DeepSpeech2-era worked example, overlap, and scaling curves."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.errors import PlanError
from dlscale.plan.collective import FABRICS, Algorithm, Topology
from dlscale.plan.plots import plot_scaling
from dlscale.plan.train import (
    BACKWARD_SHARE,
    Cluster,
    TrainingJob,
    plan_training,
    requirement,
    scaling_curves,
    scaling_sizes,
)

# One training cycle of the DeepSpeech2 era: ~10 EFLOP (1e19 FLOPs) and ~4 TB (4.09e12 B) of data.
CYCLE_FLOPS = 1.0e19
CYCLE_BYTES = 4.09e12
HOUR = 3600.0


def test_deepspeech2_requirements() -> None:
    eight = requirement(CYCLE_FLOPS, CYCLE_BYTES, 8 * HOUR)
    # 1e19 / 28,800 s = 347 TFLOP/s ("about 350"); 4.09e12 / 28,800 s = 142 MB/s
    assert eight.flops_per_s == pytest.approx(350e12, rel=0.02)
    assert eight.bytes_per_s == pytest.approx(142e6, rel=0.005)
    two = requirement(CYCLE_FLOPS, CYCLE_BYTES, 2 * HOUR)
    # 1e19 / 7,200 s = 1.39 PFLOP/s ("about 1.5"); 4.09e12 / 7,200 s = 568 MB/s
    assert two.flops_per_s == pytest.approx(1.5e15, rel=0.1)
    assert two.bytes_per_s == pytest.approx(568e6, rel=0.005)
    # at 40% of a 989 TFLOP/s GPU: 1.39e15 / 395.6e12 -> 4 GPUs, communication aside
    assert two.gpus(989e12, 0.4) == 4
    with pytest.raises(PlanError):
        requirement(CYCLE_FLOPS, CYCLE_BYTES, 0)


def test_deepspeech2_forward() -> None:
    # The same cycle run at 350 TFLOP/s sustained (one 875 TFLOP/s GPU at 40%) takes ~8 h and
    # reads 142 MB/s. 1e19 = 1e6 samples x 1e13 FLOPs; 4.09e12 B = 1e6 x 4.09 MB.
    job = TrainingJob(1e13, 1_000_000, 1, batch_per_gpu=100, bytes_per_sample=4.09e6)
    plan = plan_training(job, Cluster(Topology(1), peak_flops=875e12, mfu=0.4))
    assert plan.total_s == pytest.approx(1e19 / 350e12)
    assert plan.total_s / HOUR == pytest.approx(7.94, abs=0.01)
    assert plan.sustained_flops == pytest.approx(350e12)
    assert plan.data_bandwidth == pytest.approx(4.09e12 / (1e19 / 350e12))
    assert plan.efficiency == 1.0


def test_compute_comm_and_overlap() -> None:
    # 8 GPUs of 1000 TFLOP/s at 50%: 32 samples x 1e12 FLOPs / 5e14 = 64 ms compute per step
    topo = Topology(8, 1, FABRICS["nvlink4"])
    job = TrainingJob(1e12, 8 * 32 * 10, 1, gradient_bytes=1e9, batch_per_gpu=32)
    serial = plan_training(job, Cluster(topo, 1000e12, 0.5, overlap=0.0))
    assert serial.steps == 10
    assert serial.compute_s == pytest.approx(64e-3)
    comm = serial.allreduce.seconds  # ring, 4.78 ms (see test_collective)
    assert serial.exposed_comm_s == pytest.approx(comm)
    assert serial.total_s == pytest.approx(10 * (64e-3 + comm))
    hidden = plan_training(job, Cluster(topo, 1000e12, 0.5, overlap=1.0))
    assert hidden.exposed_comm_s == 0.0  # 4.78 ms < 2/3 x 64 ms of backward
    # overlap 0.05 hides 0.05 x 2/3 x 64 ms = 2.13 ms of it
    partly = plan_training(job, Cluster(topo, 1000e12, 0.5, overlap=0.05))
    assert partly.exposed_comm_s == pytest.approx(comm - 0.05 * BACKWARD_SHARE * 64e-3)


def job_and_cluster(inter: str = "ib-400g") -> tuple[TrainingJob, Cluster]:
    # a 1.2 GB gradient (300M parameters, fp32); 16 x 1e12 FLOPs = 40 ms of compute per step
    job = TrainingJob(1e12, 10_000_000, 1, gradient_bytes=1.2e9, batch_per_gpu=16)
    topo = Topology(8, 4, FABRICS["nvlink4"], FABRICS[inter])
    return job, Cluster(topo, 989e12, 0.4)


def test_scaling_curves() -> None:
    job, cluster = job_and_cluster("eth-100g")
    curves = scaling_curves(job, cluster, (Algorithm.RING, Algorithm.TREE), max_nodes=64)
    ring = curves[Algorithm.RING]
    assert [p.gpus for p in ring] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert ring[0].efficiency == 1.0  # one GPU: nothing to all-reduce
    times = [p.total_s for p in ring]
    assert times == sorted(times, reverse=True)  # more GPUs, shorter run
    # leaving NVLink for 100 Gb/s Ethernet costs efficiency
    assert ring[4].efficiency < ring[3].efficiency
    assert all(0 < p.efficiency <= 1 for p in ring)
    # at 64 nodes the tree's log2 latency beats the ring's 2(n-1) steps
    assert curves[Algorithm.TREE][-1].total_s < ring[-1].total_s


def test_scaling_sizes_stop_at_one_node_without_a_network() -> None:
    assert scaling_sizes(Topology(4, 1, FABRICS["pcie4"])) == [(1, 1), (2, 1), (4, 1)]


def test_scaling_plot(tmp_path: Path) -> None:
    job, cluster = job_and_cluster()
    curves = scaling_curves(job, cluster, max_nodes=8)
    out = plot_scaling(curves, tmp_path / "scaling.png", "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_jobs() -> None:
    with pytest.raises(PlanError):
        TrainingJob(0, 10)
    with pytest.raises(PlanError):
        TrainingJob(1e9, 10, batch_per_gpu=0)
    with pytest.raises(PlanError):
        Cluster(Topology(1), 1e12, mfu=1.5)
    with pytest.raises(PlanError):
        Cluster(Topology(1), 1e12, overlap=2)
