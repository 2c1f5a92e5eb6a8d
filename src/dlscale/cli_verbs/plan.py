"""`dlscale plan train`, `plan serve` and `bench allreduce`: their arguments (plan/ runs them)."""

from __future__ import annotations

from pathlib import Path

from dlscale.cli_verbs import LazyHandler, SubParsers, output_file


def add_verbs(sub: SubParsers) -> None:
    """`dlscale plan train` and `dlscale plan serve` (`bench allreduce`: see bench.SUBVERBS)."""
    plan = sub.add_parser("plan", help="capacity and training-time planners")
    verbs = plan.add_subparsers(dest="plan_verb", metavar="PLAN", required=True)

    t = verbs.add_parser("train", help="training time on N GPUs with ring or tree all-reduce")
    t.add_argument("--flops-per-sample", type=float, required=True, help="training FLOPs (fwd+bwd)")
    t.add_argument(
        "--samples", type=lambda v: int(float(v)), required=True, help="samples per epoch (1e9 ok)"
    )
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    t.add_argument("--nodes", type=int, default=1)
    t.add_argument("--device", default="H100-SXM", help="catalog name (default H100-SXM)")
    t.add_argument("--peak-tflops", type=float, help="per-GPU peak instead of the catalog's")
    t.add_argument("--precision", default="bf16")
    t.add_argument("--intra", default="nvlink4", help="fabric inside a node (default nvlink4)")
    t.add_argument("--inter", help="fabric between nodes, e.g. ib-400g, eth-100g")
    t.add_argument("--nics-per-node", type=int, help="default: one per GPU")
    t.add_argument("--mfu", type=float, default=0.4, help="achieved share of peak (default 0.4)")
    t.add_argument("--gradient-bytes", type=float, default=0.0, help="bytes all-reduced per step")
    t.add_argument("--overlap", type=float, default=0.0, help="share of backward hiding comm")
    t.add_argument("--batch-per-gpu", type=int, default=32)
    t.add_argument("--bytes-per-sample", type=float, default=0.0, help="input bytes per sample")
    t.add_argument("--algo", default="auto", help="ring, tree, hierarchical, in-network, auto")
    t.add_argument("--deadline", help="also show what finishing in this time needs, e.g. 8h")
    t.add_argument(
        "--plot",
        type=output_file,
        help="write scaling curves (time, efficiency vs GPUs) to this PNG",
    )
    t.add_argument(
        "--tf-mirrored",
        type=int,
        metavar="N",
        help="also train a small model with TensorFlow MirroredStrategy on N virtual CPU "
        "devices and set the planner's data-parallel prediction beside it",
    )
    t.set_defaults(func=LazyHandler("dlscale.plan.commands", "plan_train"))

    s = verbs.add_parser("serve", help="fewest devices of each kind that hold a p99 SLO")
    s.add_argument("--model", help="zoo model name or .onnx file")
    s.add_argument("--repo", type=Path, help="model repository holding --model")
    s.add_argument("--qps", type=float, help="requests per second to serve")
    s.add_argument("--p99", help="p99 latency bound, e.g. 15ms")
    s.add_argument("--mig", help="a MIG layout on this catalog GPU for the --tenant models")
    s.add_argument(
        "--tenant",
        action="append",
        help="with --mig: model=NAME,qps=Q,p99=15ms[,memory=20GB][,profile=FILE] (repeat)",
    )
    s.add_argument("--devices", help="catalog names, comma-separated")
    s.add_argument("--profile", help="measured batch latencies (JSON, see docs/plan.md)")
    s.add_argument("--efficiency", type=float, help="share of the roofline reached (default 0.4)")
    s.add_argument("--precision", default="int8")
    s.add_argument("--max-batch", type=int, help="largest batch to consider (default 256)")
    s.add_argument("--price", help="dollars per device-hour: H100-SXM=2.5,L4=0.8")
    s.add_argument("--flops-per-sample", type=float, help="instead of counting --model's graph")
    s.add_argument("--bytes-per-sample", type=float, help="with --flops-per-sample")
    s.add_argument("--json", type=output_file, help="also write the plans to this file")
    from dlscale.plan import llm_flags  # a generative model's flags: declared beside its planner

    llm_flags.add_flags(s)
    s.set_defaults(func=LazyHandler("dlscale.plan.commands", "plan_serve"))


def add_bench_allreduce(sub: SubParsers) -> None:
    """`dlscale bench allreduce`: register under whichever `bench` parser owns the verb."""
    a = sub.add_parser("allreduce", help="time torch.distributed all-reduce beside the model")
    a.add_argument("--nproc", type=int, default=2, help="processes (GPUs with nccl)")
    a.add_argument(
        "--backend",
        choices=("gloo", "nccl", "tf-mirrored"),
        default="gloo",
        help="tf-mirrored: TensorFlow MirroredStrategy over --nproc virtual CPU devices",
    )
    a.add_argument("--sizes", help="LO:HI bytes, doubling (default 1K:64M gloo, 1K:1G nccl)")
    a.add_argument("--iters", type=int, default=20)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--fabric", help="what the model assumes (default: loopback measured here)")
    a.add_argument(
        "--plot", type=output_file, help="write measured vs model bus bandwidth to this PNG"
    )
    a.add_argument("--json", type=output_file, help="write the report to this file")
    a.set_defaults(func=LazyHandler("dlscale.plan.commands", "bench_allreduce"))
