"""`dlscale plan serve --mig GPU --tenant ...`: a MIG layout for tenants and their objectives."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from dlscale.errors import ConfigError, PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.detect import detect
from dlscale.hardware.report import table
from dlscale.models.flops import count
from dlscale.models.locate import onnx_file
from dlscale.plan.mig import CurveOn, MigLayout, MigTenant, assign, plan_mig
from dlscale.plan.serve import Profile, Workload, curve_on
from dlscale.plan.units import human_seconds, parse_duration
from dlscale.serving.memory.sizes import parse_size

_KEYS = ("model", "qps", "p99", "name", "flops", "bytes", "memory", "profile")


def parse_tenant(text: str, args: argparse.Namespace) -> MigTenant:
    """`model=resnet50,qps=2000,p99=15ms[,name=..][,flops=..,bytes=..][,memory=20GB][,profile=F]`."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in _KEYS:
            raise PlanError(f"--tenant {text!r}: expected KEY=VALUE pairs with keys {list(_KEYS)}")
        fields[key.strip()] = value.strip()
    if "qps" not in fields or "p99" not in fields:
        raise PlanError(f"--tenant {text!r}: give qps= and p99= (e.g. qps=500,p99=15ms)")
    workload = _workload(text, fields, args)
    try:
        memory = parse_size(fields.get("memory", "0"))
    except ConfigError as e:
        raise PlanError(f"--tenant {text!r}: {e}") from None
    return MigTenant(
        fields.get("name") or workload.name,
        _number(text, fields, "qps"),
        parse_duration(fields["p99"]),
        _curve_on(workload, fields.get("profile"), args),
        memory,
    )


def _number(text: str, fields: dict[str, str], key: str) -> float:
    try:
        return float(fields.get(key, "0"))
    except ValueError:
        raise PlanError(f"--tenant {text!r}: {key} must be a number") from None


def _workload(text: str, fields: dict[str, str], args: argparse.Namespace) -> Workload:
    if "flops" in fields:
        moved = _number(text, fields, "bytes")
        flops = _number(text, fields, "flops")
        return Workload(fields.get("model", "model"), flops, lambda _p, _b: moved)
    if "model" not in fields:
        raise PlanError("each --tenant needs model= (zoo name or .onnx file) or flops=,bytes=")
    cost = count(onnx_file(fields["model"], args.repo))
    return Workload(fields["model"], cost.flops, cost.bytes_per_sample)


def _curve_on(workload: Workload, profile_path: str | None, args: argparse.Namespace) -> CurveOn:
    profile = Profile.load(Path(profile_path)) if profile_path else None
    return curve_on(workload, profile, args.precision, args.efficiency, args.max_batch)


def plan_serve_mig(args: argparse.Namespace) -> int:
    """The layout, each tenant's placement, and where this host's MIG instances take them."""
    device = load_catalog().get(args.mig)
    if not device.mig_profiles:
        raise PlanError(f"{device.name} has no MIG profiles (A30, A100, H100 and H200 have)")
    tenants = [parse_tenant(t, args) for t in args.tenant or []]
    layout = plan_mig(device, tenants)
    print(_text(layout))
    here = [g for g in detect().gpus if g.catalog == device.name and g.mig_enabled]
    mapping = assign(layout, here[0]) if here else None
    if mapping:
        print("on this host (config.toml [[instances]] device):")
        for tenant, uuids in mapping.items():
            print(f"  {tenant}: {', '.join(uuids)}")
    if args.json:
        out = dataclasses.asdict(layout) | {"assignment": mapping}
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def _text(layout: MigLayout) -> str:
    rows = [
        [
            p.tenant, p.profile, str(p.instances), f"{p.peak_rate_per_instance:,.0f}",
            str(p.max_batch), human_seconds(p.max_delay_s) if p.max_delay_s else "0", p.basis,
        ]
        for p in layout.placements
    ]  # fmt: skip
    headers = ["tenant", "profile", "instances", "peak/inst", "batch", "delay", "basis"]
    lines = [f"MIG layout on {layout.device}: {layout.compute_slices} compute slices", ""]
    lines.append(table(headers, rows))
    for n, gpu in enumerate(layout.gpus, start=1):
        held = " + ".join(f"{profile} ({tenant})" for tenant, profile in gpu.instances)
        lines.append(
            f"GPU {n}: {held}; {gpu.compute_slices} compute, {gpu.memory_slices} memory slices"
        )
    if layout.unplaceable:
        lines.append(f"no profile holds: {', '.join(layout.unplaceable)} (a whole GPU or more)")
    return "\n".join(lines)
