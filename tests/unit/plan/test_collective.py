"""The all-reduce cost model against cases worked by hand from NCCL's constants."""

from __future__ import annotations

import math

import pytest

from dlscale.errors import PlanError
from dlscale.plan.collective import (
    FABRICS,
    Algorithm,
    Protocol,
    Topology,
    allreduce,
    available,
    bus_bandwidth,
    fabric,
)

NV4 = FABRICS["nvlink4"]  # 18 links x 20.6 GB/s = 370.8 GB/s per GPU
IB = FABRICS["ib-400g"]  # 400 Gb/s = 50 GB/s per NIC
GB = 1e9
S = 1e9  # bytes all-reduced


def one_node(gpus: int) -> Topology:
    return Topology(gpus, 1, NV4)


def cluster(gpus: int, nodes: int, inter: str = "ib-400g") -> Topology:
    return Topology(gpus, nodes, NV4, fabric(inter))


def test_ring_two_gpus() -> None:
    # steps 2(n-1) = 2; latency 8.4 + 2 x 3.4 = 15.2 us
    # algbw = 370.8 GB/s x n / 2(n-1) = 370.8 GB/s; transfer 1e9 / 370.8e9 = 2.6969 ms
    e = allreduce(S, one_node(2), "ring", "simple")
    assert e.latency_s == pytest.approx(15.2e-6)
    assert e.transfer_s == pytest.approx(S / 370.8e9)
    assert e.algbw == pytest.approx(S / (15.2e-6 + S / 370.8e9))
    assert e.busbw == pytest.approx(e.algbw)  # 2(n-1)/n = 1 at n = 2


def test_ring_eight_gpus() -> None:
    # steps 14; latency 8.4 + 14 x 3.4 = 56.0 us
    # algbw = 370.8 x 8/14 = 211.886 GB/s; transfer 4.7195 ms; busbw -> 370.8 GB/s for big S
    e = allreduce(S, one_node(8), "ring", "simple")
    assert e.latency_s == pytest.approx(56.0e-6)
    assert e.transfer_s == pytest.approx(S / (370.8e9 * 8 / 14))
    assert e.seconds == pytest.approx(4.7755e-3, rel=1e-4)
    huge = allreduce(1e15, one_node(8), "ring", "simple")
    assert huge.busbw == pytest.approx(370.8e9, rel=1e-4)


def test_ring_sixty_four_gpus_on_eight_nodes() -> None:
    # steps 126, of which 2 x 8 = 16 cross a node boundary:
    # latency 8.4 + 110 x 3.4 + 16 x 14.0 = 606.4 us
    # bus = min(NVLink 370.8, 8 NICs x 50 = 400) = 370.8 GB/s; algbw = 370.8 x 64/126
    e = allreduce(S, cluster(8, 8), "ring", "simple")
    assert e.latency_s == pytest.approx(606.4e-6)
    assert e.transfer_s == pytest.approx(S / (370.8e9 * 64 / 126))
    assert e.seconds == pytest.approx(5.9159e-3, rel=1e-4)


def test_ring_bus_is_the_nics_when_they_are_slower() -> None:
    # 8 GPUs share 2 x 100 Gb/s NICs: bus = 2 x 12.5 = 25 GB/s, not NVLink's 370.8
    t = Topology(8, 4, NV4, fabric("eth-100g"), nics_per_node=2)
    assert t.bus_bandwidth == pytest.approx(25 * GB)
    e = allreduce(S, t, "ring", "simple")
    assert e.transfer_s == pytest.approx(S / (25e9 * 32 / 62))


def test_tree_two_eight_and_sixty_four() -> None:
    # Simple: no base latency, 28 us per hop; LL: base 6.8, 0.6 (NVLink) / 5.0 (net) per hop
    # n = 2, one node: 2 x (1 x 28) = 56 us; algbw = 370.8 x 0.92 / 2 = 170.568 GB/s
    two = allreduce(S, one_node(2), "tree", "simple")
    assert two.latency_s == pytest.approx(56e-6)
    assert two.transfer_s == pytest.approx(S / 170.568e9)
    # n = 8, one node: 2 x 7 x 28 = 392 us (NCCL's trees are chains inside a node)
    assert allreduce(S, one_node(8), "tree", "simple").latency_s == pytest.approx(392e-6)
    # n = 64 = 8 x 8: 2 x (7 x 28 + log2(8) x 28) = 560 us; LL: 6.8 + 2 x (7 x 0.6 + 3 x 5) = 45.2
    assert allreduce(S, cluster(8, 8), "tree", "simple").latency_s == pytest.approx(560e-6)
    assert allreduce(1e3, cluster(8, 8), "tree", "ll").latency_s == pytest.approx(45.2e-6)


def test_tree_latency_grows_with_log2_of_nodes_ring_linearly() -> None:
    # one GPU per node, LL: tree 6.8 + 2 x log2(N) x 5.0; ring 6.6 + 2(N-1) x 2.7
    for nodes, tree_us, ring_us in ((8, 36.8, 44.4), (64, 66.8, 346.8), (512, 96.8, 2766.0)):
        t = Topology(1, nodes, NV4, IB)
        assert allreduce(8, t, "tree", "ll").latency_s == pytest.approx(tree_us * 1e-6)
        assert allreduce(8, t, "ring", "ll").latency_s == pytest.approx(ring_us * 1e-6)


def test_hierarchical() -> None:
    # reduce-scatter in node, all-reduce of S/8 across 8 nodes on each GPU's own 50 GB/s NIC,
    # all-gather in node: latency 3 x 8.4 + 2 x 7 x 3.4 + 2 x 7 x 14.0 = 268.8 us
    # transfer 2 x 7/8 x S / 370.8e9 + 2 x 7/8 x (S/8) / 50e9 = 4.7195 + 4.375 ms
    e = allreduce(S, cluster(8, 8), "hierarchical")
    assert e.latency_s == pytest.approx(268.8e-6)
    assert e.transfer_s == pytest.approx(1.75 * S / 370.8e9 + 1.75 * S / 8 / 50e9)


def test_in_network_reduction() -> None:
    # NVLS in the node (23 us) + SHARP between nodes (30 us); each rank sends S once:
    # transfer = max(S / 370.8 GB/s, S / (8 x 50 GB/s)) = 2.6969 ms
    e = allreduce(S, cluster(8, 8), "in-network")
    assert e.latency_s == pytest.approx(53e-6)
    assert e.transfer_s == pytest.approx(S / 370.8e9)
    ring = allreduce(S, cluster(8, 8), "ring")
    assert ring.seconds / e.seconds > 2  # the switch halves the bytes and skips the ring steps


def test_in_network_needs_a_fabric_that_reduces() -> None:
    eth = cluster(8, 8, "eth-400g")
    assert Algorithm.IN_NETWORK not in available(eth)
    with pytest.raises(PlanError, match="does not apply"):
        allreduce(S, eth, "in-network")
    a100 = Topology(8, 1, FABRICS["nvlink3"])  # no NVSwitch reduction before NVLink 4
    assert Algorithm.IN_NETWORK not in available(a100)


def test_auto_takes_the_fastest() -> None:
    t = cluster(8, 64, "eth-400g")
    small, large = allreduce(1024, t), allreduce(S, t)
    assert small.protocol is Protocol.LL
    assert large.protocol is Protocol.SIMPLE
    for algo in available(t):
        assert small.seconds <= allreduce(1024, t, algo).seconds
        assert large.seconds <= allreduce(S, t, algo).seconds
    assert allreduce(1024, t).algorithm is Algorithm.TREE  # 64 nodes: log2 beats 2(n-1)


def test_bus_bandwidth_definition() -> None:
    assert bus_bandwidth(100.0, 8) == pytest.approx(100.0 * 2 * 7 / 8)
    assert bus_bandwidth(100.0, 1) == 0.0


def test_one_rank_costs_nothing() -> None:
    e = allreduce(S, one_node(1))
    assert e.seconds == 0.0
    assert math.isinf(e.algbw)


def test_fabric_names_and_errors() -> None:
    assert fabric("IB-NDR") is FABRICS["ib-400g"]
    assert fabric("pcie5").bandwidth == pytest.approx(48 * GB)
    assert fabric("nvlink5").bandwidth == pytest.approx(18 * 40.1 * GB)
    with pytest.raises(PlanError, match="unknown fabric"):
        fabric("carrier-pigeon")
    with pytest.raises(PlanError, match="inter-node fabric"):
        Topology(8, 2, NV4)
    with pytest.raises(PlanError, match="unknown algorithm"):
        allreduce(S, one_node(8), "butterfly")
    with pytest.raises(PlanError, match="non-negative"):
        allreduce(-1, one_node(8))
