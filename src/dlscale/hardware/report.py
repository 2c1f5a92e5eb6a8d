"""Plain-text views of the catalog, the host's devices and a roofline, for the command line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dlscale.hardware.detect import HostInfo
from dlscale.hardware.roofline import Roofline
from dlscale.hardware.spec import PRECISIONS, DeviceSpec


def si(value: float | None, unit: str = "") -> str:
    """A number with an SI prefix: 1.979e15 -> '1.98 P'."""
    if value is None:
        return "-"
    for factor, prefix in (
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def catalog_table(devices: Iterable[DeviceSpec]) -> str:
    """One line per device: dense peaks in TFLOP/s, memory, bandwidth, power."""
    peaks = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
    rows = [["name", "kind", *peaks, "mem GB", "GB/s", "W"]]
    rows += [
        [
            spec.name,
            spec.kind,
            *(_num(spec.peak_flops(p), 1e12) for p in peaks),
            _num(spec.memory_bytes, 1e9, ".4g"),
            _num(spec.memory_bandwidth, 1e9),
            _num(spec.tdp_watts, 1.0),
        ]
        for spec in devices
    ]
    return table(None, rows, 2) + "\n(dense peaks in TFLOP/s or TOP/s; '-' where none is published)"


def device_text(spec: DeviceSpec) -> str:
    """Every figure of one entry with its source."""
    lines = [f"{spec.name}  ({spec.vendor} {spec.architecture}, {spec.kind}; {spec.form_factor})"]
    if spec.aliases:
        lines.append(f"  aliases: {', '.join(spec.aliases)}")
    if spec.member:
        lines.append(f"  system of {spec.count} x {spec.member}")
    for precision in PRECISIONS:
        dense, sparse = spec.peak_flops(precision), spec.peak_flops(precision, sparse=True)
        if dense is None and sparse is None:
            continue
        unit = "OP/s" if precision.startswith("int") else "FLOP/s"
        text = f"  {precision:5} dense {si(dense, unit):>14}"
        if sparse is not None:
            text += f"   sparse {si(sparse, unit)}"
        lines.append(f"{text}   [{spec.source(precision)}]")
    figures = (
        ("memory", si(spec.memory_bytes, "B")),
        ("bandwidth", si(spec.memory_bandwidth, "B/s")),
        ("tdp", si(spec.tdp_watts, "W")),
        ("interconnect", str(spec.interconnect) if spec.interconnect else "-"),
        ("host_link", str(spec.host_link) if spec.host_link else "-"),
    )
    for name, text in figures:
        where = f"   [{spec.source(name)}]" if text != "-" else ""
        lines.append(f"  {name:12} {text}{where}")
    if spec.mig_profiles:
        lines.append(f"  MIG profiles   [{spec.source('mig')}]")
        for p in spec.mig_profiles:
            lines.append(
                f"    {p.name:10} {p.slices}/{p.total_slices} compute, "
                f"{si(p.memory_bytes, 'B')}, up to {p.max_instances}"
            )
    if spec.notes:
        lines.append(f"  notes: {spec.notes}")
    return "\n".join(lines)


def host_text(host: HostInfo) -> str:
    """The CPU, then each GPU with its MIG instances."""
    cpu = host.cpu
    lines = [
        f"CPU: {cpu.model} ({cpu.arch}), {cpu.physical_cores} cores / {cpu.logical_cores} threads, "
        f"{cpu.ghz} GHz ({cpu.ghz_from}), {cpu.vector}{', AMX' if cpu.amx else ''}, "
        f"memory {si(cpu.memory_bytes, 'B')}"
    ]
    if not host.gpus:
        lines.append(f"GPUs: none (NVML {host.nvml})")
    else:
        lines.append(f"GPUs: {len(host.gpus)} (driver {host.driver_version})")
    for gpu in host.gpus:
        mig = {None: "no MIG", True: "MIG on", False: "MIG off"}[gpu.mig_enabled]
        lines.append(
            f"  [{gpu.index}] {gpu.name}  {gpu.uuid}\n"
            f"      catalog {gpu.catalog or '(no match)'}, memory {si(gpu.memory_bytes, 'B')}, "
            f"compute capability {gpu.compute_capability or '-'}, "
            f"SM clock max {gpu.sm_clock_max_mhz or '-'} MHz, "
            f"power limit {si(gpu.power_limit_watts, 'W')}, {mig}"
        )
        for m in gpu.mig_instances:
            lines.append(
                f"      MIG {m.index}: {m.profile or m.name}  {m.uuid}  {si(m.memory_bytes, 'B')}"
            )
        for why in gpu.unanswered:
            lines.append(f"      (no answer: {why})")
    return "\n".join(lines)


def roofline_text(
    model: str, line: Roofline, measured: float | None = None, best: Roofline | None = None
) -> str:
    """The two ceilings at the line's batch, the one that applies, the measured share when
    given, and the ceiling at the best batch when given."""
    op = "OP" if line.precision.startswith("int") else "FLOP"
    work = si(line.flops_per_sample, op)
    ridge = f"{line.ridge_point:.1f}" if line.ridge_point else "-"
    text = [
        f"{model} on {line.device} at {line.precision}, batch {line.batch}:",
        f"  work per sample    {work}, {si(line.bytes_per_sample, 'B')} "
        f"(intensity {line.arithmetic_intensity:.1f} {op}/B; device ridge {ridge} {op}/B)",
        f"  compute ceiling    {si(line.peak_flops, op + '/s')} / {work}"
        f" = {line.compute_bound_rate:,.0f} samples/s",
    ]
    if line.memory_bandwidth and line.bytes_per_sample:
        text.append(
            f"  memory ceiling     {si(line.memory_bandwidth, 'B/s')} / "
            f"{si(line.bytes_per_sample, 'B')} = {line.memory_bound_rate:,.0f} samples/s"
        )
    else:
        text.append("  memory ceiling     none (no bandwidth published or no bytes counted)")
    text.append(f"  attainable         {line.attainable_rate:,.0f} samples/s ({line.bound}-bound)")
    if measured is not None:
        text.append(f"  measured           {measured:,.0f} samples/s = {line.share(measured):.1%}")
    if best is not None and best.batch != line.batch:
        text.append(
            f"  best batch         {best.batch}: {best.attainable_rate:,.0f} samples/s "
            f"({best.bound}-bound: the highest any batch allows, within 1%)"
        )
    return "\n".join(text)


def _num(value: float | None, scale: float, fmt: str = "g") -> str:
    return "-" if value is None else format(value / scale, fmt)


def table(
    headers: Sequence[str] | None, rows: Sequence[Sequence[str]], right_from: int | None = None
) -> str:
    """A plain text table, columns padded to their widest cell (right-aligned from column
    `right_from` on, when given); no header line when `headers` is None."""
    cells = [list(headers)] if headers else []
    cells += [list(r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    right = len(widths) if right_from is None else right_from
    lines = [
        "  ".join(
            c.rjust(w) if i >= right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in cells
    ]
    if headers:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
