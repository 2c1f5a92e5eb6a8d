"""The `dlscale plan train`, `plan serve`, `roofline` and `bench allreduce` verbs.

Each turns parsed arguments into calls on the planners and prints a table; cli.py only parses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from dlscale.errors import DlscaleError, NotFound, PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.commands import local_device
from dlscale.hardware.report import roofline_text, table
from dlscale.hardware.roofline import Roofline, batch_roofline, best_roofline
from dlscale.hardware.roofline import roofline as roofline_of
from dlscale.models.cost import ModelCost
from dlscale.models.flops import count
from dlscale.models.locate import onnx_file
from dlscale.plan import allreduce_bench, collective
from dlscale.plan.collective import Topology
from dlscale.plan.serve import Profile, ServiceCurve, Workload, curve_on, plan_serving
from dlscale.plan.train import Cluster, TrainingJob, plan_training, requirement, scaling_curves
from dlscale.plan.units import human_bytes, human_seconds, parse_duration, parse_prices
from dlscale.types import Traffic

DEFAULT_SERVE_DEVICES = ("H100-SXM", "H200-SXM", "A100-SXM", "L40S", "L4", "T4")


def plan_train(args: argparse.Namespace) -> int:
    """`dlscale plan train`: training time on a cluster, and optionally its scaling curves."""
    if args.peak_tflops is not None:
        peak, device_name = args.peak_tflops * 1e12, f"{args.peak_tflops:g} TFLOP/s GPU"
    else:
        spec = load_catalog().get(args.device)
        found = spec.peak_flops(args.precision)
        if not found:
            raise PlanError(f"{args.device} has no published {args.precision} peak")
        peak, device_name = found, f"{args.device} ({args.precision})"
    inter = collective.fabric(args.inter) if args.inter else None
    topo = Topology(args.gpus, args.nodes, collective.fabric(args.intra), inter, args.nics_per_node)
    job = TrainingJob(
        args.flops_per_sample,
        args.samples,
        args.epochs,
        args.gradient_bytes,
        args.batch_per_gpu,
        args.bytes_per_sample,
    )
    cluster = Cluster(topo, peak, args.mfu, args.overlap)
    plan = plan_training(job, cluster, args.algo)
    comm = plan.allreduce
    print(
        f"{topo.ranks} x {device_name}: {args.nodes} node(s) x {args.gpus} GPU(s), MFU {args.mfu:g}"
    )
    rows = [
        ["total FLOPs", f"{job.total_flops:.3g}"],
        ["steps", f"{plan.steps} (global batch {job.batch_per_gpu * topo.ranks})"],
        ["compute per step", human_seconds(plan.compute_s)],
        [
            "all-reduce per step",
            f"{human_seconds(comm.seconds)} ({comm.algorithm}/{comm.protocol}, "
            f"{human_bytes(job.gradient_bytes)}, busbw {comm.busbw / 1e9:.1f} GB/s)",
        ],
        [
            "exposed comm per step",
            f"{human_seconds(plan.exposed_comm_s)} (overlap {args.overlap:g})",
        ],
        ["scaling efficiency", f"{100 * plan.efficiency:.1f}%"],
        ["training time", human_seconds(plan.total_s)],
        ["sustained", f"{plan.sustained_flops / 1e12:.1f} TFLOP/s"],
        ["data bandwidth needed", f"{plan.data_bandwidth / 1e6:.1f} MB/s"],
    ]
    if args.deadline:
        need = requirement(job.total_flops, job.total_bytes, parse_duration(args.deadline))
        rows.append(
            [
                f"to finish in {args.deadline}",
                f"{need.flops_per_s / 1e12:.1f} TFLOP/s sustained, {need.bytes_per_s / 1e6:.1f} "
                f"MB/s, >= {need.gpus(peak, args.mfu)} GPUs",
            ]
        )
    print(table(None, rows))
    if args.plot:
        from dlscale.plan.plots import plot_scaling

        curves = scaling_curves(job, cluster)  # ring and tree
        title = f"{device_name}, {args.intra}" + (f" + {args.inter}" if args.inter else "")
        print(f"scaling curves: {plot_scaling(curves, Path(args.plot), title)}")
    if args.tf_mirrored:
        _tf_mirrored_check(args.tf_mirrored)
    return 0


def _tf_mirrored_check(replicas: int) -> None:
    """A measured data-parallel step (TensorFlow, virtual CPU devices) beside the planner's."""
    from dlscale.plan.tf_mirrored import check_training

    c = check_training(replicas)
    print(
        f"\nTensorFlow MirroredStrategy, {c.replicas} virtual CPU devices, dense model of "
        f"{c.params:,} parameters, batch {c.batch_per_replica} per replica:\n"
        f"  measured step {human_seconds(c.step_many_s)} (1 replica: {human_seconds(c.step_one_s)},"
        f" the planner's compute)\n"
        f"  planner predicts {human_seconds(c.predicted_s)} (all-reduce "
        f"{human_seconds(c.predicted_comm_s)}); measured / predicted {c.ratio:.2f}\n"
        f"  model: {c.fabric_note}"
    )


def load_workload(args: argparse.Namespace) -> Workload:
    """FLOPs and bytes per sample from the command line, or counted in the model's ONNX graph."""
    if args.flops_per_sample is not None:
        if args.bytes_per_sample is None:
            raise PlanError("--flops-per-sample needs --bytes-per-sample too")
        moved = float(args.bytes_per_sample)
        return Workload(args.model or "model", args.flops_per_sample, lambda _p, _b: moved)
    if not args.model:
        raise PlanError("give --model (zoo name or .onnx file) or --flops/--bytes-per-sample")
    cost = count(onnx_file(args.model, args.repo))
    return Workload(args.model, cost.flops, cost.bytes_per_sample)


def plan_serve(args: argparse.Namespace) -> int:
    """`dlscale plan serve`: the fewest devices of each kind holding a p99 SLO at a load."""
    if args.mig:
        from dlscale.plan.mig_commands import plan_serve_mig

        return plan_serve_mig(args)
    from dlscale.plan.llm_commands import decoder_shape, plan_serve_llm

    if args.rate is not None or decoder_shape(args.model, args.repo) is not None:
        return plan_serve_llm(args)  # a generative model: tokens, TTFT and TPOT
    if args.qps is None or args.p99 is None:
        raise PlanError("give --qps and --p99 (or --mig GPU with --tenant ...)")
    workload = load_workload(args)
    p99 = parse_duration(args.p99)
    names = args.devices.split(",") if args.devices else list(DEFAULT_SERVE_DEVICES)
    devices = [load_catalog().get(n) for n in names]
    prices = parse_prices(args.price)
    curves: list[ServiceCurve] = []
    if args.profile:
        profile = Profile.load(Path(args.profile))
        smallest = min(profile.batch_latency_s)
        if smallest > 1:
            print(
                f"note: the profile starts at batch {smallest}; smaller batches are taken to cost "
                f"as much (an upper bound). `dlscale bench --scenario all` also times small ones."
            )
        if profile.precision != args.precision:
            print(f"using the profile's precision {profile.precision}, not {args.precision}")
        precision = profile.precision
        on = curve_on(workload, profile, precision)
        curves = [on(d) for d in devices]
    else:
        precision = args.precision
        on = curve_on(workload, None, precision, args.efficiency, args.max_batch)
        for d in devices:
            try:
                curves.append(on(d))
            except DlscaleError as exc:
                print(f"skipped: {exc}")
    plans = plan_serving(curves, args.qps, p99, prices)
    print(
        f"{workload.name} at {args.qps:g} requests/s, p99 <= {human_seconds(p99)}, {precision}; "
        "one queue per device behind a load balancer"
    )
    rows = [
        [
            p.device,
            str(p.devices) if p.devices is not None else "cannot",
            f"{p.peak_rate_per_device:,.0f}",
            str(p.max_batch),
            human_seconds(p.max_delay_s) if p.max_delay_s else "0",
            f"{p.power_watts:,.0f}" if p.power_watts is not None else "-",
            f"{p.cost_per_million:.4g}" if p.cost_per_million is not None else "-",
            p.basis,
        ]
        for p in plans
    ]
    headers = ["device", "count", "peak/dev", "batch", "delay", "power W", "$/M inf", "basis"]
    print(table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps([p.__dict__ for p in plans], indent=2))
    return 0


def roofline(args: argparse.Namespace) -> int:
    """`dlscale roofline`: the ceiling a device allows a model at a batch and at its best batch,
    and a measured rate's share."""
    spec = load_catalog().get(args.device or local_device())
    batch = args.batch or 1
    best: Roofline | None = None
    if args.flops is not None and args.bytes is not None:
        line = roofline_of(spec, args.precision, args.flops, args.bytes, batch)
    else:
        cost = _model_cost(args.repo, args.model)
        flops = cost.flops if args.flops is None else args.flops
        traffic = cost.traffic(args.precision)
        if args.bytes is not None:
            traffic = Traffic(0.0, args.bytes)
        line = batch_roofline(spec, args.precision, flops, traffic, batch)
        best = best_roofline(spec, args.precision, flops, traffic)
    if args.json:
        doc = {"model": args.model, **line.to_dict(args.measured)}
        if best is not None:
            doc["best"] = best.to_dict()
        print(json.dumps(doc, indent=2))
    else:
        print(roofline_text(args.model, line, args.measured, best))
    return 0


def _model_cost(repo: Path | None, model: str) -> ModelCost:
    """The model's FLOP and byte counts from its ONNX file (a zoo model is built if missing)."""
    try:
        return count(onnx_file(model, repo))
    except NotFound as exc:
        raise NotFound(f"{exc}; give --repo, or --flops and --bytes") from None


def bench_allreduce(args: argparse.Namespace) -> int:
    """`dlscale bench allreduce`: measured all-reduce beside the cost model's prediction."""
    from dlscale.plan.units import parse_size_range

    default = "1K:1G" if args.backend == "nccl" else "1K:64M"
    sizes = parse_size_range(args.sizes or default)
    fabric = collective.fabric(args.fabric) if args.fabric else None
    if args.backend == "tf-mirrored":
        from dlscale.plan import tf_mirrored

        report = tf_mirrored.run_allreduce(args.nproc, sizes, args.iters, args.warmup)
    else:
        report = allreduce_bench.run(
            args.nproc, args.backend, sizes, args.iters, args.warmup, fabric
        )
    print(f"all-reduce, {args.nproc} x {args.backend}, median of {args.iters} calls")
    print(f"model: {report.fabric_note}")
    rows = [
        [
            human_bytes(r.nbytes),
            human_seconds(r.seconds),
            f"{r.algbw / 1e9:.3f}",
            f"{r.busbw / 1e9:.3f}",
            human_seconds(r.predicted_s),
            f"{r.predicted_busbw / 1e9:.3f}",
            f"{r.seconds / r.predicted_s:.2f}",
            r.predicted_algorithm,
        ]
        for r in report.rows
    ]
    headers = [
        "size",
        "time",
        "algbw GB/s",
        "busbw GB/s",
        "model",
        "model busbw",
        "x model",
        "algo",
    ]
    print(table(headers, rows))
    print(f"reduced values checked: {report.values_checked:,} elements, all correct")
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(report), indent=2))
    if args.plot:
        from dlscale.plan.plots import plot_allreduce

        title = f"all-reduce, {args.nproc} x {args.backend} ({report.fabric})"
        print(f"plot: {plot_allreduce(report.rows, Path(args.plot), title)}")
    return 0
