"""`dlscale plan serve` for a generative model: devices for a token load under TTFT and TPOT.

plan/commands.py hands over here when --model names a decoder (a Hugging Face folder, a
repository model whose version folder is one, or a zoo decoder) or when --rate is given.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from dlscale.errors import DlscaleError, PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.report import table
from dlscale.hardware.spec import DeviceSpec
from dlscale.models.config import newest_file
from dlscale.plan.host_memory import with_bandwidth
from dlscale.plan.llm import DecoderShape, from_config, read_config
from dlscale.plan.llm_capacity import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MBU,
    DEFAULT_MFU,
    DEFAULT_RESERVE,
    DecoderOnDevice,
    Efficiency,
    LlmPlan,
    TokenLoad,
    plan_device,
)
from dlscale.plan.llm_kernels import read_kernels
from dlscale.plan.llm_passes import Scheduling
from dlscale.plan.serve import cheapest_first
from dlscale.plan.units import human_bytes, human_seconds, parse_prices

DEFAULT_LLM_DEVICES = ("H100-SXM", "H200-SXM", "A100-SXM", "L40S", "L4")
#: The MLPerf llama3.1-8b Server bounds (shared/reference/generative.md), when none is given.
DEFAULT_TTFT_MS = 2000.0
DEFAULT_TPOT_MS = 100.0


def decoder_shape(model: str | None, repo: Path | None) -> DecoderShape | None:
    """The shape of the decoder `model` names, or None when it names none.

    A folder holding config.json, a config.json itself, a repository model folder whose newest
    version holds one (in --repo or given as a path), or a zoo decoder's name.
    """
    if not model:
        return None
    path = Path(model)
    candidates = [path] if path.name != model or repo is None else []
    if repo is not None:
        candidates.append(repo / model)
    for folder in candidates:
        if path.name == "config.json" and folder.is_file():
            return read_config(folder)
        if (folder / "config.json").is_file():
            return read_config(folder, folder.name)
        newest = newest_file(folder, "config.json") if folder.is_dir() else None
        if newest is not None:
            return read_config(newest.parent, folder.name)
    from dlscale.models.zoo.decoder import DECODERS

    found = DECODERS.get(model)
    if found is None:
        return None
    return from_config(found.hf_fields(), found.name)


def device_for_plan(name: str) -> DeviceSpec:
    """The catalog entry; the host CPU's gets its memory bandwidth measured here."""
    spec = load_catalog().get(name)
    if spec.kind == "cpu" and spec.memory_bandwidth is None:
        spec = with_bandwidth(spec)
    return spec


def plan_serve_llm(args: argparse.Namespace) -> int:
    """Print (and with --json write) one plan per device kind for the token load."""
    shape = decoder_shape(args.model, args.repo)
    if shape is None:
        raise PlanError(
            "--rate plans a generative model: give --model a Hugging Face folder (config.json), "
            "a repository model holding one, or a zoo decoder (llama-tiny, llama-small, llama-1b)"
        )
    if args.dtype:
        shape = shape.with_dtype(args.dtype)
    if args.rate is None or args.isl is None or args.osl is None:
        raise PlanError(f"{shape.name} is generative: give --rate, --isl and --osl")
    load = TokenLoad(
        args.rate,
        args.isl,
        args.osl,
        (args.ttft_ms if args.ttft_ms is not None else DEFAULT_TTFT_MS) / 1e3,
        (args.tpot_ms if args.tpot_ms is not None else DEFAULT_TPOT_MS) / 1e3,
    )
    if shape.max_positions is not None and load.context > shape.max_positions:
        print(f"note: ISL + OSL = {load.context} exceeds the model's context {shape.max_positions}")
    efficiency = Efficiency(
        args.mbu or DEFAULT_MBU,
        args.mfu or DEFAULT_MFU,
        (args.host_us or 0.0) / 1e6,
        args.mbu_vector or None,
        (args.host_us_layer or 0.0) / 1e6,
        (args.host_us_request or 0.0) / 1e6,
        kernel_share=args.kernel_share or 1.0,
    )
    kernels = read_kernels(args.kernels) if args.kernels else None
    scheduling = Scheduling(args.step_tokens, args.dense_attention)
    reserve = DEFAULT_RESERVE if args.reserve is None else args.reserve
    top = args.max_batch or DEFAULT_MAX_BATCH
    if top < 1:
        raise PlanError(f"--max-batch must be at least 1, got {top}")
    prices = parse_prices(args.price)
    names = args.devices.split(",") if args.devices else list(DEFAULT_LLM_DEVICES)
    plans: list[LlmPlan] = []
    for name in names:
        try:
            device = device_for_plan(name.strip())
            on_device = DecoderOnDevice(shape, device, efficiency, reserve, scheduling, kernels)
        except DlscaleError as exc:
            print(f"skipped: {exc}")
            continue
        plans.append(plan_device(on_device, load, top, prices.get(on_device.device.name)))
    plans.sort(key=lambda p: cheapest_first(p.devices, p.cost_per_million_tokens))
    print(
        f"{shape.summary()}, weights {human_bytes(shape.weight_bytes)}\n"
        f"{load.rate:g} requests/s, ISL {load.isl}, OSL {load.osl}, TTFT <= "
        f"{human_seconds(load.ttft_s)}, TPOT <= {human_seconds(load.tpot_s)}; continuous "
        "batching, one engine per device"
    )
    print(table(_HEADERS, [_row(p) for p in plans]))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in plans], indent=2))
    return 0


_HEADERS = [
    "device",
    "count",
    "batch",
    "fits",
    "TTFT",
    "TPOT",
    "tok/s/dev",
    "req/s/dev",
    "power W",
    "$/M tok",
    "basis",
]


def _row(p: LlmPlan) -> list[str]:
    count = str(p.devices) if p.devices is not None else "cannot"
    return [
        p.device,
        count,
        str(p.batch) if p.batch else "-",
        f"{p.fits:,}",
        human_seconds(p.ttft_s),
        human_seconds(p.tpot_s),
        f"{p.tokens_per_s:,.0f}",
        f"{p.requests_per_s:.3g}",
        f"{p.power_watts:,.0f}" if p.power_watts is not None else "-",
        f"{p.cost_per_million_tokens:.3g}" if p.cost_per_million_tokens is not None else "-",
        p.basis,
    ]
