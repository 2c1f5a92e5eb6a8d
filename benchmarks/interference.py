"""Two tenants on one device: `dlscale bench interference` on this machine's CPU, or on a GPU.

    python -m benchmarks.interference --device cpu --repeats 6 --duration 10
    python -m benchmarks.interference --device cuda --repeats 5 --duration 10   # resnet50 beside

CPU: the protected tenant is `protected` (eight 512x512 MatMul+ReLU layers, 8 MB of weights),
the neighbor `flood` (four 1024x1024 layers, 16 MB, batches of up to 64, sent as requests of 4
rows: a request is never split, so that is the least a neighbor batch can block), both using
every core (intra-op threads 0), in one process as `dlscale serve` would hold them. GPU: the
protected tenant is the same small stack on cuda:0, the neighbor the zoo's resnet50 (batches of
up to 64) on cuda:0. The protected objective is `--objective` (default 1.2x the median p99 the
tenant has alone over three alone-only repetitions, measured first: the issue's target). The
report (JSON, Markdown, PNG) goes to bench-results/interference-<device>-<date>/.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.harness.models import RESNET50, build_resnet50
from benchmarks.harness.servers import RESULTS, WORK
from dlscale.bench import interference_report
from dlscale.bench.interference import InterferenceOptions, run_interference

WIDTH = 1024


def stack_graph(layers: int, width: int = WIDTH, seed: int = 0) -> onnx.GraphProto:
    """`layers` MatMul+ReLU of width x width, seeded weights; FP32 [N, width] in and out."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "input"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{k}"))
        out = "output" if k == layers - 1 else f"r{k}"
        nodes += [
            helper.make_node("MatMul", [x, f"w{k}"], [f"h{k}"]),
            helper.make_node("Relu", [f"h{k}"], [out]),
        ]
        x = out
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", width])
        for n in ("input", "output")
    ]
    return helper.make_graph(nodes, f"stack{layers}", [io[0]], [io[1]], weights)


def write_tenant(root: Path, name: str, graph: onnx.GraphProto | None, config: str) -> None:
    """REPO/<name>/config.toml, and the model file when `graph` is given."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.toml").write_text(config)
    if graph is not None:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        onnx.save(model, root / name / "1" / "model.onnx")


def tenants(root: Path, device: str) -> Path:
    """The protected stack and its neighbor (a wider-batched stack on CPU, resnet50 on a GPU)."""
    place = f'[[instances]]\ndevice = "{device}"\n'
    write_tenant(
        root, "protected", stack_graph(8, 512), f"max_batch_size = 4\n{place}[qos]\nweight = 1.0\n"
    )
    neighbor = f"max_batch_size = 64\n{place}[qos]\nweight = 1.0\n"
    if device == "cpu":
        write_tenant(root, "flood", stack_graph(4, seed=1), neighbor)
    else:
        if not build_resnet50(root):
            raise SystemExit("resnet50 needs the zoo (the [torch] extra)")
        (root / RESNET50.name / "config.toml").write_text(neighbor)
    return root


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:0)")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    p.add_argument("--rate", type=float, default=50.0, help="protected requests/s")
    p.add_argument("--objective", type=float, help="protected p99 objective, ms")
    p.add_argument("--concurrency", type=int, default=32, help="the neighbor's requests in flight")
    p.add_argument("--neighbor-batch", type=int, default=4, help="rows per neighbor request")
    p.add_argument("--repo-only", type=Path, help="only write the tenants' repository here")
    args = p.parse_args(argv)
    device = "cpu" if args.device == "cpu" else "cuda:0"
    if args.repo_only:
        print(tenants(args.repo_only, device))
        return
    repo = tenants(WORK / f"interference-{args.device}", device)
    neighbor = "flood" if device == "cpu" else RESNET50.name
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"interference-{args.device}-{stamp}"
    objective = args.objective / 1e3 if args.objective else None
    if objective is None:
        objective = _calibrate(repo, neighbor, args, out / "calibration")
        print(f"objective: 1.2 x the protected p99 alone = {objective * 1e3:.2f} ms")
    options = InterferenceOptions(
        protected="protected",
        neighbor=neighbor,
        repo=repo,
        rate=args.rate,
        objective_s=objective,
        duration_s=args.duration,
        repeats=args.repeats,
        concurrency=args.concurrency,
        neighbor_batch=args.neighbor_batch,
    )
    setup, phases, rate = run_interference(options, out)
    report = interference_report.build_report(options, setup, phases, rate)
    interference_report.print_summary(interference_report.write(report, out))


def _calibrate(repo: Path, neighbor: str, args: argparse.Namespace, out: Path) -> float:
    """1.2 x the median p99 of the protected tenant alone over three alone-only repetitions."""
    options = InterferenceOptions(
        protected="protected",
        neighbor=neighbor,
        repo=repo,
        rate=args.rate,
        objective_s=1.0,  # a placeholder: only the alone phase runs
        duration_s=args.duration,
        repeats=3,
        concurrency=args.concurrency,
        neighbor_batch=args.neighbor_batch,
        alone_only=True,
    )
    _, phases, _ = run_interference(options, out)
    alone = [p.p99_s for p in phases if p.condition == "alone" and p.p99_s]
    return 1.2 * float(np.median(alone))


if __name__ == "__main__":
    main()
