"""All-reduce cost model: time = latency term + bytes / algorithm bandwidth, after NCCL's own.

The constants are NCCL's tuning model (src/graph/tuning.cc, src/graph/topo.h) and the bandwidth
definitions are nccl-tests' (doc/PERFORMANCE.md); docs/plan.md cites them and works examples.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TypeVar

from dlscale.errors import PlanError

_E = TypeVar("_E", bound=enum.StrEnum)

GB = 1e9
US = 1e-6


class Algorithm(enum.StrEnum):
    """All-reduce algorithms the model knows."""

    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"
    IN_NETWORK = "in-network"


class Protocol(enum.StrEnum):
    """NCCL's wire protocols: LL (low latency, 1/4 of the bandwidth) and Simple."""

    LL = "ll"
    SIMPLE = "simple"


class LinkClass(enum.StrEnum):
    """NCCL's three hardware latency classes (NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET)."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


# NCCL tuning.cc `baseLat` (µs): fixed cost of one collective, per algorithm and protocol.
_BASE_LATENCY_US: dict[tuple[Algorithm, Protocol], float] = {
    (Algorithm.TREE, Protocol.LL): 6.8,
    (Algorithm.TREE, Protocol.SIMPLE): 0.0,
    (Algorithm.RING, Protocol.LL): 6.6,
    (Algorithm.RING, Protocol.SIMPLE): 8.4,
}
# NCCL tuning.cc `hwLat` (µs): cost of one step (one hop) per link class, algorithm, protocol.
_HOP_LATENCY_US: dict[tuple[LinkClass, Algorithm, Protocol], float] = {
    (LinkClass.NVLINK, Algorithm.TREE, Protocol.LL): 0.6,
    (LinkClass.NVLINK, Algorithm.TREE, Protocol.SIMPLE): 28.0,
    (LinkClass.NVLINK, Algorithm.RING, Protocol.LL): 0.6,
    (LinkClass.NVLINK, Algorithm.RING, Protocol.SIMPLE): 3.4,
    (LinkClass.PCI, Algorithm.TREE, Protocol.LL): 1.0,
    (LinkClass.PCI, Algorithm.TREE, Protocol.SIMPLE): 28.0,
    (LinkClass.PCI, Algorithm.RING, Protocol.LL): 1.0,
    (LinkClass.PCI, Algorithm.RING, Protocol.SIMPLE): 5.7,
    (LinkClass.NET, Algorithm.TREE, Protocol.LL): 5.0,
    (LinkClass.NET, Algorithm.TREE, Protocol.SIMPLE): 28.0,
    (LinkClass.NET, Algorithm.RING, Protocol.LL): 2.7,
    (LinkClass.NET, Algorithm.RING, Protocol.SIMPLE): 14.0,
}
# NCCL tuning.cc: NVLS (NVLink SHARP) latency on NVLink, CollNet-Chain (IB SHARP) on the network.
_NVLS_LATENCY_US = 23.0
_COLLNET_LATENCY_US = 30.0
# NCCL tuning.cc bandwidth refinements: ring LL carries 1/4 of the bus bandwidth; a tree keeps
# 92% of it (Simple) and LL a further 1/3.8; a tree's algorithm bandwidth is half its bus one.
_BUS_FACTOR: dict[tuple[Algorithm, Protocol], float] = {
    (Algorithm.RING, Protocol.LL): 1 / 4,
    (Algorithm.RING, Protocol.SIMPLE): 1.0,
    (Algorithm.TREE, Protocol.LL): 0.92 / 3.8,
    (Algorithm.TREE, Protocol.SIMPLE): 0.92,
}


@dataclass(frozen=True)
class Fabric:
    """One kind of link: its bandwidth per GPU (or per NIC) in one direction, and its latency class.

    `bandwidth` is what the model uses (NCCL's effective figure where NCCL has one); `note`
    gives the datasheet figure beside it. `step_latency_s` replaces NCCL's latency tables for
    fabrics NCCL does not drive (gloo over loopback), where `base_latency_s` is the fixed cost
    per call.
    """

    name: str
    link_class: LinkClass
    bandwidth: float
    in_network_reduction: bool = False
    step_latency_s: float | None = None
    base_latency_s: float = 0.0
    note: str = ""

    def hop_latency(self, algo: Algorithm, protocol: Protocol) -> float:
        """Seconds for one step of `algo` over this fabric."""
        if self.step_latency_s is not None:
            return self.step_latency_s
        return _HOP_LATENCY_US[(self.link_class, algo, protocol)] * US


def _nvlink(gen: int, links: int, per_link: float, nominal_bidir: float, nvls: bool) -> Fabric:
    return Fabric(
        name=f"nvlink{gen}",
        link_class=LinkClass.NVLINK,
        bandwidth=links * per_link * GB,
        in_network_reduction=nvls,
        note=f"{links} links x {per_link} GB/s (NCCL topo.h), {nominal_bidir:g} GB/s bidirectional",
    )


def _pcie(gen: int, nccl_gbs: float, nominal_gbs: float) -> Fabric:
    return Fabric(
        name=f"pcie{gen}",
        link_class=LinkClass.PCI,
        bandwidth=nccl_gbs * GB,
        note=f"x16: NCCL counts {nccl_gbs:g} GB/s, line rate {nominal_gbs:g} GB/s per direction",
    )


def _net(name: str, gbit: int, sharp: bool, what: str) -> Fabric:
    return Fabric(
        name=name,
        link_class=LinkClass.NET,
        bandwidth=gbit / 8 * GB,
        in_network_reduction=sharp,
        note=f"{what}, {gbit} Gb/s per NIC",
    )


#: The fabrics by name. NVLink per-link figures are NCCL's (18, 20, 20, 20.6, 40.1 GB/s for
#: Pascal to Blackwell); NVLink 4 and 5 reduce in the NVSwitch (NVLS); InfiniBand switches
#: from HDR on reduce in the network (SHARP); PCIe x16 as NCCL counts it (12 GB/s per Gen3 x16).
FABRICS: dict[str, Fabric] = {
    f.name: f
    for f in (
        _nvlink(1, 4, 18.0, 160, nvls=False),
        _nvlink(2, 6, 20.0, 300, nvls=False),
        _nvlink(3, 12, 20.0, 600, nvls=False),
        _nvlink(4, 18, 20.6, 900, nvls=True),
        _nvlink(5, 18, 40.1, 1800, nvls=True),
        _pcie(3, 12.0, 15.75),
        _pcie(4, 24.0, 31.5),
        _pcie(5, 48.0, 63.0),
        _net("ib-200g", 200, sharp=True, what="InfiniBand HDR"),
        _net("ib-400g", 400, sharp=True, what="InfiniBand NDR"),
        _net("ib-800g", 800, sharp=True, what="InfiniBand XDR"),
        _net("eth-100g", 100, sharp=False, what="Ethernet (RoCE)"),
        _net("eth-200g", 200, sharp=False, what="Ethernet (RoCE)"),
        _net("eth-400g", 400, sharp=False, what="Ethernet (RoCE)"),
    )
}
_ALIASES = {"ib-hdr": "ib-200g", "ib-ndr": "ib-400g", "ib-xdr": "ib-800g"}


def fabric(name: str) -> Fabric:
    """The fabric called `name` (e.g. nvlink4, pcie5, ib-400g, ib-ndr, eth-100g)."""
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return FABRICS[key]
    except KeyError:
        known = ", ".join([*FABRICS, *_ALIASES])
        raise PlanError(f"unknown fabric {name!r}; known: {known}") from None


def loopback(bandwidth: float, step_latency_s: float, base_latency_s: float = 0.0) -> Fabric:
    """A one-host fabric (gloo over TCP loopback or shared memory) with given figures."""
    return Fabric(
        name="loopback",
        link_class=LinkClass.PCI,
        bandwidth=bandwidth,
        step_latency_s=step_latency_s,
        base_latency_s=base_latency_s,
        note="one host; figures measured or stated by the caller",
    )


@dataclass(frozen=True)
class Topology:
    """`nodes` hosts of `gpus_per_node` GPUs: `intra` joins GPUs in a host, `inter` the hosts.

    Each host has `nics_per_node` NICs of the `inter` fabric (default: one per GPU, as in
    rail-optimized clusters such as DGX).
    """

    gpus_per_node: int
    nodes: int = 1
    intra: Fabric = FABRICS["nvlink4"]
    inter: Fabric | None = None
    nics_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise PlanError("a topology needs at least one GPU per node and one node")
        if self.nodes > 1 and self.inter is None:
            raise PlanError(f"{self.nodes} nodes need an inter-node fabric (e.g. ib-400g)")

    @property
    def ranks(self) -> int:
        """All GPUs taking part."""
        return self.gpus_per_node * self.nodes

    @property
    def node_net_bandwidth(self) -> float:
        """Bytes/s one host can send to the others in one direction over all its NICs."""
        if self.inter is None:
            return math.inf
        return (self.nics_per_node or self.gpus_per_node) * self.inter.bandwidth

    @property
    def bus_bandwidth(self) -> float:
        """The bottleneck a ring or tree through all ranks sees (nccl-tests' bus bandwidth).

        Every rank moves the data over its intra-node link, and every host moves it over its
        NICs together, so the slower of the two bounds the bus.
        """
        if self.nodes == 1:
            return self.intra.bandwidth
        if self.gpus_per_node == 1:
            return self.node_net_bandwidth
        return min(self.intra.bandwidth, self.node_net_bandwidth)


@dataclass(frozen=True)
class Estimate:
    """The predicted cost of one all-reduce of `nbytes` and the bandwidths it implies."""

    algorithm: Algorithm
    protocol: Protocol
    nbytes: float
    ranks: int
    latency_s: float
    transfer_s: float

    @property
    def seconds(self) -> float:
        """Total time: latency term plus transfer term."""
        return self.latency_s + self.transfer_s

    @property
    def algbw(self) -> float:
        """Bytes/s as nccl-tests defines it: size / time."""
        return self.nbytes / self.seconds if self.seconds > 0 else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth of an all-reduce: algbw · 2(n−1)/n."""
        return bus_bandwidth(self.algbw, self.ranks)


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth from the algorithm bandwidth."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def _ring(nbytes: float, t: Topology, p: Protocol) -> Estimate:
    n = t.ranks
    steps = 2 * (n - 1)
    # Each of the two passes crosses every host boundary once (NCCL: nInterSteps = 2·nNodes).
    net_steps = min(2 * t.nodes, steps) if t.nodes > 1 else 0
    latency = _base(t, Algorithm.RING, p) + (steps - net_steps) * t.intra.hop_latency(
        Algorithm.RING, p
    )
    if t.inter is not None:
        latency += net_steps * t.inter.hop_latency(Algorithm.RING, p)
    algbw = t.bus_bandwidth * _factor(t, Algorithm.RING, p) * n / steps
    return Estimate(Algorithm.RING, p, nbytes, n, latency, nbytes / algbw)


def _tree(nbytes: float, t: Topology, p: Protocol) -> Estimate:
    # NCCL: a chain inside each host, a double binary tree between hosts, up then down; the
    # tree's depth is floor(log2 nodes) (NCCL's log2i).
    latency = _base(t, Algorithm.TREE, p) + 2 * (
        (t.gpus_per_node - 1) * t.intra.hop_latency(Algorithm.TREE, p)
        + (t.nodes.bit_length() - 1) * (t.inter.hop_latency(Algorithm.TREE, p) if t.inter else 0.0)
    )
    algbw = t.bus_bandwidth * _factor(t, Algorithm.TREE, p) / 2
    return Estimate(Algorithm.TREE, p, nbytes, t.ranks, latency, nbytes / algbw)


def _hierarchical(nbytes: float, t: Topology) -> Estimate:
    # Reduce-scatter in the host, all-reduce of each GPU's 1/g share across hosts on its own
    # rail, all-gather in the host: three collectives one after another, not pipelined.
    assert t.inter is not None
    g, nodes, p = t.gpus_per_node, t.nodes, Protocol.SIMPLE
    intra_hop = t.intra.hop_latency(Algorithm.RING, p)
    net_hop = t.inter.hop_latency(Algorithm.RING, p)
    latency = 3 * _base(t, Algorithm.RING, p) + 2 * (g - 1) * intra_hop + 2 * (nodes - 1) * net_hop
    per_gpu_net = t.node_net_bandwidth / g
    transfer = 2 * (g - 1) / g * nbytes / t.intra.bandwidth
    transfer += 2 * (nodes - 1) / nodes * (nbytes / g) / per_gpu_net
    return Estimate(Algorithm.HIERARCHICAL, p, nbytes, t.ranks, latency, transfer)


def _in_network(nbytes: float, t: Topology) -> Estimate:
    # The switch adds: each rank sends its data up once and gets the sum back once, so no
    # 2(n−1)/n factor. In the host NVLS when the NVSwitch reduces, else a ring RS + AG.
    g, p = t.gpus_per_node, Protocol.SIMPLE
    latency = intra = inter = 0.0
    if g > 1 and t.intra.in_network_reduction:
        latency += _NVLS_LATENCY_US * US
        intra = nbytes / t.intra.bandwidth
    elif g > 1:
        latency += 2 * (g - 1) * t.intra.hop_latency(Algorithm.RING, p)
        intra = 2 * (g - 1) / g * nbytes / t.intra.bandwidth
    if t.nodes > 1:
        latency += _COLLNET_LATENCY_US * US
        inter = nbytes / t.node_net_bandwidth
    return Estimate(Algorithm.IN_NETWORK, p, nbytes, t.ranks, latency, max(intra, inter))


def _base(t: Topology, algo: Algorithm, p: Protocol) -> float:
    if t.intra.step_latency_s is not None:
        return t.intra.base_latency_s
    return _BASE_LATENCY_US[(algo, p)] * US


def _factor(t: Topology, algo: Algorithm, p: Protocol) -> float:
    # A fabric NCCL does not drive (gloo) has no protocol refinements.
    return 1.0 if t.intra.step_latency_s is not None else _BUS_FACTOR[(algo, p)]


def available(t: Topology) -> list[Algorithm]:
    """The algorithms that apply to this topology."""
    algos = [Algorithm.RING, Algorithm.TREE]
    if t.nodes > 1 and t.gpus_per_node > 1:
        algos.append(Algorithm.HIERARCHICAL)
    sharp_net = t.nodes > 1 and t.inter is not None and t.inter.in_network_reduction
    nvls = t.nodes == 1 and t.gpus_per_node > 1 and t.intra.in_network_reduction
    if sharp_net or nvls:
        algos.append(Algorithm.IN_NETWORK)
    return algos


def allreduce(
    nbytes: float,
    topology: Topology,
    algorithm: Algorithm | str = "auto",
    protocol: Protocol | str = "auto",
) -> Estimate:
    """Predicted time of one all-reduce of `nbytes` per rank; "auto" picks the fastest."""
    if nbytes < 0:
        raise PlanError(f"all-reduce size must be non-negative, got {nbytes}")
    if topology.ranks == 1:
        return Estimate(Algorithm.RING, Protocol.SIMPLE, nbytes, 1, 0.0, 0.0)
    algos = available(topology) if algorithm == "auto" else [_parse(Algorithm, algorithm)]
    for a in algos:
        if a not in available(topology):
            raise PlanError(f"{a} all-reduce does not apply to {_describe(topology)}")
    protos = [Protocol.LL, Protocol.SIMPLE] if protocol == "auto" else [_parse(Protocol, protocol)]
    if topology.intra.step_latency_s is not None:
        protos = [Protocol.SIMPLE]
    candidates: list[Estimate] = []
    for a in algos:
        if a is Algorithm.HIERARCHICAL:
            candidates.append(_hierarchical(nbytes, topology))
        elif a is Algorithm.IN_NETWORK:
            candidates.append(_in_network(nbytes, topology))
        else:
            run = _ring if a is Algorithm.RING else _tree
            candidates.extend(run(nbytes, topology, p) for p in protos)
    return min(candidates, key=lambda e: e.seconds)


def _parse(kind: type[_E], value: _E | str) -> _E:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(m.value for m in kind)
        raise PlanError(f"unknown {kind.__name__.lower()} {value!r}; known: {known}") from None


def _describe(t: Topology) -> str:
    inter = f" over {t.inter.name}" if t.inter and t.nodes > 1 else ""
    return f"{t.nodes} node(s) x {t.gpus_per_node} GPU(s) on {t.intra.name}{inter}"
