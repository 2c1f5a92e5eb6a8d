"""`dlscale optimize`: its arguments (dlscale.optimize.commands runs it)."""

from __future__ import annotations

from pathlib import Path

from dlscale.cli_verbs import LazyHandler, SubParsers


def add_verbs(sub: SubParsers) -> None:
    """optimize: the fastest variant within an accuracy tolerance, and SLO tuning."""
    opt = sub.add_parser(
        "optimize", help="find the fastest variant of a model that keeps its accuracy"
    )
    opt.add_argument("repo", type=Path, help="model repository")
    opt.add_argument("model", help="model name (its newest version is the FP32 reference)")
    opt.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default auto)")
    opt.add_argument("--tolerance", default="1%", help="largest accuracy change (1%% or 0.01)")
    opt.add_argument(
        "--metric",
        default="auto",
        choices=["auto", "top1", "agreement", "cosine", "maxabs"],
        help="accuracy metric (auto: top1 with labels, agreement for classifiers, else cosine)",
    )
    opt.add_argument("--slo-p99", help="p99 bound to tune batching for (15ms)")
    opt.add_argument("--time-budget", default="10m", help="wall-clock budget (10m, 90s)")
    opt.add_argument("--only", default="", help="comma-separated variant name prefixes to try")
    opt.set_defaults(func=LazyHandler("dlscale.optimize.commands", "optimize"))
