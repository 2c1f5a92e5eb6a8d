"""Generative serving capacity: step times, TTFT, TPOT and devices for a token load.

A decode step reads the weights once and every running sequence's KV cache, and computes two
FLOPs per active parameter per sequence. On a GPU its time is the larger of bytes /
(bandwidth x MBU) and FLOPs / (peak x MFU), the roofline with an efficiency on each ceiling
(thousands of threads hide the reads behind the arithmetic); on a CPU it is their sum (a core
streams the weights and multiplies them in turn). Prefill is the same over a prompt's tokens,
compute-bound for any prompt of more than a few tokens. Each pass also costs the host time per
sequence and per layer, and an engine may split a prompt across passes (llm_passes.py).
Continuous batching runs B sequences at once; docs/plan.md gives the steady-state model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dlscale.errors import PlanError
from dlscale.hardware.spec import DeviceSpec
from dlscale.plan.llm import DecoderShape
from dlscale.plan.llm_kernels import Kernels
from dlscale.plan.llm_passes import Pass, Scheduling, burst

#: Shares of the peaks an engine reaches unless told (--mbu, --mfu): the ceilings measured on
#: one H100 SXM (shared/reference/accelerators.md): a device-to-device copy at ~3.0 of 3.35 TB/s,
#: a bf16 8192^3 matrix product at ~798 of 989 TFLOP/s. A plan with them is the best a device
#: allows; benchmarks/plan_llm_check.py measures an engine's own on this host.
DEFAULT_MBU = 0.9
DEFAULT_MFU = 0.8
#: Share of memory left out of weights and KV cache (activations, the runtime, fragmentation):
#: vLLM's default --gpu-memory-utilization is 0.9 (docs.vllm.ai, engine arguments).
DEFAULT_RESERVE = 0.1
#: Largest batch of sequences considered: vLLM's default max_num_seqs on GPUs under 70 GiB and
#: CPUs is 256 (shared/reference/generative.md, get_batch_defaults).
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True)
class Efficiency:
    """What an engine reaches: shares of peak bandwidth (MBU) and compute (MFU), in (0, 1],
    its host work per sequence in a pass (a decode step's generated token: sampling,
    detokenizing, streaming; 0 by default, the device alone), the share of bandwidth of a pass
    over one token (None: MBU), its host work per layer in a pass (dispatching each layer's
    modules and kernels, whatever the batch; 0 by default), its host work per request
    admitted (tokenizing the prompt, setting up its stream; 0 by default), the share of
    measured kernels' speed its products reach (llm_kernels.py; 1: as measured), and its host
    work once per burst of requests that finds it idle (waking its loop, the first pass's
    set-up; 0 by default, and not in a busy engine's steady state)."""

    mbu: float = DEFAULT_MBU
    mfu: float = DEFAULT_MFU
    host_s_per_token: float = 0.0
    #: A pass over one token multiplies each weight matrix by a vector, whose kernel streams
    #: the weights at its own rate; two tokens or more run matrix-matrix kernels at `mbu`.
    mbu_vector: float | None = None
    host_s_per_layer: float = 0.0
    host_s_per_request: float = 0.0
    kernel_share: float = 1.0
    host_s_per_burst: float = 0.0

    def __post_init__(self) -> None:
        # Above 1: the engine's products ran faster than the same products timed alone (a
        # kernel it picks that the timing did not); 4 bounds what a timing could be off by.
        if not 0 < self.kernel_share <= 4:
            raise PlanError(f"the kernels' share must be in (0, 4], got {self.kernel_share}")
        for name, value in (
            ("MBU", self.mbu),
            ("MFU", self.mfu),
            ("MBU at batch 1", self.mbu_vector),
        ):
            if value is not None and not 0 < value <= 1:
                raise PlanError(f"{name} must be in (0, 1], got {value}")
        for what, seconds in (
            ("per token", self.host_s_per_token),
            ("per layer", self.host_s_per_layer),
            ("per request", self.host_s_per_request),
            ("per burst", self.host_s_per_burst),
        ):
            if not 0 <= seconds < 1:
                raise PlanError(f"host time {what} must be in [0, 1) s, got {seconds}")

    def mbu_at(self, tokens: int) -> float:
        """The share of bandwidth of a pass over `tokens` tokens (matrix-vector at one)."""
        return self.mbu_vector if tokens == 1 and self.mbu_vector is not None else self.mbu


@dataclass(frozen=True)
class DecoderOnDevice:
    """One decoder on one device: the step times and what fits, from the device's figures."""

    shape: DecoderShape
    device: DeviceSpec
    efficiency: Efficiency = Efficiency()
    reserve: float = DEFAULT_RESERVE
    scheduling: Scheduling = field(default_factory=Scheduling)
    #: The products as measured on the device (None: priced by the roofline with the rest).
    kernels: Kernels | None = None

    @property
    def overlapped(self) -> bool:
        """Whether memory and compute time overlap (the roofline's max) or add (a CPU)."""
        return self.device.kind != "cpu"

    def _time(self, moved: float, flops: float, tokens: int) -> float:
        """Seconds of a pass over `tokens` tokens that moves `moved` bytes and does `flops`."""
        bandwidth, peak = self.peaks
        memory = moved / (bandwidth * self.efficiency.mbu_at(tokens))
        compute = flops / (peak * self.efficiency.mfu)
        return max(memory, compute) if self.overlapped else memory + compute

    def __post_init__(self) -> None:
        if not 0 <= self.reserve < 1:
            raise PlanError(f"the memory reserve must be in [0, 1), got {self.reserve}")
        missing = [
            what
            for what, value in (
                ("memory bandwidth", self.device.memory_bandwidth),
                (f"{self.shape.precision} peak", self.device.peak_flops(self.shape.precision)),
                ("memory size", self.device.memory_bytes),
            )
            if not value
        ]
        if missing:
            raise PlanError(f"{self.device.name} publishes no {' or '.join(missing)}")

    @property
    def peaks(self) -> tuple[float, float]:
        """The device's peak bytes/s and FLOP/s at the shape's precision (before MBU and MFU)."""
        bandwidth, peak = self.device.memory_bandwidth, self.device.peak_flops(self.shape.precision)
        assert bandwidth is not None and peak is not None  # checked in __post_init__
        return bandwidth, peak

    def pass_work(self, work: Pass) -> tuple[float, float]:
        """(bytes, FLOPs) of one forward pass.

        It reads the weights once (the embedding rows of its tokens only) and the KV cache its
        sequences hold, and writes its tokens' K and V. Per-sequence attention reads each key
        once and scores each new token against its own sequence's keys; dense attention (one
        masked attention over the pass) gathers every key the pass reads into a copy (read and
        written), expands it to every query head (written and read again: grouped-query
        attention under a mask falls back to full heads), and scores every new token against
        every key of the pass. Each token costs 2 FLOPs per active parameter (a multiply and an
        add) and, per layer and key it scores, 2 x heads x head_dim for QK^T and as many for the
        weighted sum of V. With measured kernels the weights' products are left out (timed as
        measured, pass_kernel_s); the embedding rows gathered stay.
        """
        shape = self.shape
        keys = work.cached + work.tokens
        kv, attended = keys * shape.kv_bytes_per_token, work.attended
        if self.scheduling.dense_attention:
            kv *= 2 + 2 * shape.heads / shape.kv_heads
            attended = work.tokens * keys
        attention = 4.0 * shape.layers * shape.heads * shape.head_dim * attended
        if self.kernels is not None:  # the weights' products are timed apart (pass_kernel_s)
            gathered = 0 if shape.tied_embeddings else work.tokens * shape.hidden
            return gathered * shape.element_bytes + kv, attention
        flops = 2.0 * shape.active_parameters * work.tokens + attention
        return shape.step_weight_bytes(work.tokens) + kv, flops

    def pass_host_s(self, work: Pass) -> float:
        """The host's seconds of one pass: per sequence in it, and per layer."""
        eff = self.efficiency
        return work.sequences * eff.host_s_per_token + self.shape.layers * eff.host_s_per_layer

    def pass_kernel_s(self, work: Pass) -> float:
        """Seconds of one pass's weight products where they were measured (else 0: in
        pass_work)."""
        if self.kernels is None:
            return 0.0
        return self.kernels.seconds(work) / self.efficiency.kernel_share

    def pass_s(self, work: Pass) -> float:
        """Seconds of one forward pass."""
        moved, flops = self.pass_work(work)
        return (
            self._time(moved, flops, work.tokens)
            + self.pass_kernel_s(work)
            + self.pass_host_s(work)
        )

    def decode_step_s(self, batch: int, context: float) -> float:
        """Seconds of one decode step for `batch` sequences whose contexts average `context`."""
        return self.pass_s(Pass.decode(batch, context))

    def prefill_s(self, prompt: int, prompts: int = 1) -> float:
        """Seconds to prefill `prompts` prompts of `prompt` tokens arriving together (first
        tokens): one pass, or the passes the engine's token budget splits them into."""
        if self.scheduling.step_tokens is None:
            return self.pass_s(Pass.prompts(prompt, prompts))
        # The passes of the burst that generates one token each: its prompts' prefill.
        return sum(self.pass_s(p) for p in burst(self.scheduling, prompts, prompt, 1).passes)

    def max_sequences(self, context: int) -> int:
        """Sequences of `context` tokens whose KV cache fits beside the weights (0: none)."""
        assert self.device.memory_bytes is not None
        free = self.device.memory_bytes * (1 - self.reserve) - self.shape.weight_bytes
        return max(0, math.floor(free / (context * self.shape.kv_bytes_per_token)))


@dataclass(frozen=True)
class TokenLoad:
    """Requests/s with ISL prompt and OSL generated tokens each, and the TTFT / TPOT bounds."""

    rate: float
    isl: int
    osl: int
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise PlanError(f"--rate must be positive, got {self.rate}")
        if not (1 <= self.isl <= 10_000_000 and 1 <= self.osl <= 10_000_000):
            raise PlanError(f"--isl and --osl must be in [1, 1e7], got {self.isl}, {self.osl}")
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise PlanError("--ttft-ms and --tpot-ms must be positive")

    @property
    def context(self) -> int:
        """Tokens a sequence holds at its end: what its KV cache must have room for."""
        return self.isl + self.osl


@dataclass(frozen=True)
class OperatingPoint:
    """One device running `batch` sequences at once, in the steady state."""

    batch: int
    ttft_s: float
    tpot_s: float

    def requests_per_s(self, osl: int) -> float:
        """Little's law: `batch` in flight, each for TTFT + (OSL - 1) x TPOT."""
        return self.batch / (self.ttft_s + (osl - 1) * self.tpot_s)


def operating_point(model: DecoderOnDevice, load: TokenLoad, batch: int) -> OperatingPoint:
    """TTFT and TPOT with `batch` sequences running, each arriving as another leaves.

    Each step decodes `batch` tokens at the mean context (ISL + OSL / 2) and carries, on
    average, batch / OSL new prompts' prefill (a sequence lives OSL steps): TPOT is the step
    with that share of prefill. A new request waits for the running step, then its prefill.
    """
    step = model.decode_step_s(batch, load.isl + load.osl / 2)
    prefill = model.prefill_s(load.isl) + model.efficiency.host_s_per_request
    return OperatingPoint(batch, prefill + step, step + batch / load.osl * prefill)


@dataclass(frozen=True)
class LlmPlan:
    """The answer for one device kind; `devices` is None when no batch meets the bounds."""

    device: str
    devices: int | None
    batch: int
    fits: int
    ttft_s: float
    tpot_s: float
    requests_per_s: float
    tokens_per_s: float
    power_watts: float | None
    cost_per_million_tokens: float | None
    basis: str


def plan_device(
    model: DecoderOnDevice,
    load: TokenLoad,
    max_batch: int = DEFAULT_MAX_BATCH,
    price_per_hour: float | None = None,
) -> LlmPlan:
    """The largest batch meeting both bounds on one device, and the devices the rate needs."""
    fits = model.max_sequences(load.context)
    eff = model.efficiency
    basis = f"MBU {eff.mbu:.3g}, MFU {eff.mfu:.3g}, {model.shape.precision}"
    if eff.mbu_vector is not None:
        basis += f", MBU at batch 1 {eff.mbu_vector:.3g}"
    if eff.host_s_per_token:
        basis += f", host {eff.host_s_per_token * 1e6:.3g} us/token"
    if eff.host_s_per_layer:
        basis += f", host {eff.host_s_per_layer * 1e6:.3g} us/layer per pass"
    if eff.host_s_per_request:
        basis += f", host {eff.host_s_per_request * 1e6:.3g} us/request"
    if model.kernels is not None:
        basis = f"weights' products as timed (share {eff.kernel_share:.3g}), " + basis
    if model.scheduling.step_tokens is not None:
        basis += f", {model.scheduling.step_tokens} tokens per pass"
    if model.scheduling.dense_attention:
        basis += ", dense attention"
    if model.device.source("bandwidth").startswith("measured"):
        basis += f"; {model.peaks[0] / 1e9:.3g} GB/s measured here"
    best: OperatingPoint | None = None
    for batch in range(1, min(fits, max_batch) + 1):
        point = operating_point(model, load, batch)
        if point.tpot_s > load.tpot_s or point.ttft_s > load.ttft_s:
            break  # both grow with the batch
        best = point
    if best is None:
        at_one = operating_point(model, load, 1)
        why = _why_not(model, load, fits, at_one)
        return LlmPlan(
            model.device.name, None, 0, fits, at_one.ttft_s, at_one.tpot_s, 0, 0, None, None, why
        )
    per_device = best.requests_per_s(load.osl)
    devices = math.ceil(load.rate / per_device)
    tdp = model.device.tdp_watts
    cost = None
    if price_per_hour is not None:
        cost = devices * price_per_hour / (load.rate * load.osl * 3600) * 1e6
    if best.batch == max_batch and fits > max_batch:
        basis += f"; batch capped at --max-batch {max_batch}"
    return LlmPlan(
        model.device.name,
        devices,
        best.batch,
        fits,
        best.ttft_s,
        best.tpot_s,
        per_device,
        per_device * load.osl,
        devices * tdp if tdp is not None else None,
        cost,
        basis,
    )


def _why_not(model: DecoderOnDevice, load: TokenLoad, fits: int, at_one: OperatingPoint) -> str:
    if fits < 1:
        weights = model.shape.weight_bytes / 1e9
        return (
            f"weights {weights:.3g} GB + one {load.context}-token KV cache exceed "
            f"{1 - model.reserve:.0%} of {model.device.memory_bytes or 0:.3g} B "
            "(tensor parallelism is not modelled)"
        )
    if at_one.tpot_s > load.tpot_s:
        return f"TPOT {at_one.tpot_s * 1e3:.3g} ms at batch 1 > {load.tpot_s * 1e3:g} ms"
    return f"TTFT {at_one.ttft_s * 1e3:.3g} ms at batch 1 > {load.ttft_s * 1e3:g} ms"
