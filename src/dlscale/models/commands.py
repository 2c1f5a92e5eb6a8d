"""The `dlscale zoo build`, `dlscale models check` and `dlscale run` verbs; cli.py only parses."""

from __future__ import annotations

import argparse

from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.models.runner import load_for_run, run_model
from dlscale.models.signature import reconcile


def zoo_build(args: argparse.Namespace) -> int:
    """`dlscale zoo build`: write the zoo's models (all, or --models) into a repository."""
    from dlscale.models.zoo import build_zoo  # the zoo's builders pull in torch

    names = [n for n in args.models.split(",") if n] or None
    for path in build_zoo(args.dir, names, seq_len=args.seq_len, progress=print):
        print(f"built {path}")
    return 0


def models_check(args: argparse.Namespace) -> int:
    """`dlscale models check`: each model's config and files, and with --load its runtime."""
    repo = ModelRepository(args.dir)
    failed = 0
    for result in repo.check():
        error = result.error
        if error is None and args.load:
            try:
                for mv in repo.versions(result.name):
                    backend = load_for_run(mv)
                    reconcile(mv.config, backend.inputs, backend.outputs, mv.path.parent)
                    backend.unload()
            except DlscaleError as exc:
                error = str(exc)
        if error is None:
            print(f"ok     {result.name} (versions {list(result.versions)})")
        else:
            failed += 1
            print(f"FAILED {result.name}: {error}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    """`dlscale run`: one model's in-process latency at batch 1 and throughput at --batch."""
    version = ModelRepository(args.dir).version(args.model)
    one, many = run_model(version, args.batch, min_seconds=args.seconds)
    print(f"model {args.model} v{version.version} on cpu")
    print(
        f"  batch 1: median {one.median_ms:.3f} ms, p90 {one.p90_ms:.3f} ms "
        f"({len(one.seconds)} runs)"
    )
    print(
        f"  batch {args.batch}: {many.throughput:.1f} samples/s "
        f"(median {many.median_ms:.3f} ms per batch, {len(many.seconds)} runs)"
    )
    return 0
