"""The `dlscale zoo build`, `models check`, `models convert` and `run` verbs; cli.py parses."""

from __future__ import annotations

import argparse
from functools import partial

from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.models.runner import load_for_run, run_model
from dlscale.models.signature import reconcile
from dlscale.models.sources import as_toml


def zoo_build(args: argparse.Namespace) -> int:
    """`dlscale zoo build`: write the zoo's models (all, or --models) into a repository."""
    from dlscale.models.zoo import build_zoo  # the zoo's builders pull in torch

    names = [n for n in args.models.split(",") if n] or None
    # Flushed at once: piped to a log, each model must show when it starts and ends.
    build_zoo(args.dir, names, seq_len=args.seq_len, progress=partial(print, flush=True))
    return 0


#: What `models check` without --load checks, and what it leaves to --load (said after the list).
CHECKED = (
    "checked without loading: each config (completed by a Triton model.py's "
    "auto_complete_config, run in a child process), its version folders and model files, and a "
    "Python model.py's syntax, model class and top-level imports"
)
NOT_CHECKED = (
    "not checked: that each runtime loads its model, that the tensors match the file, what a "
    "model.py does when run (add --load to check these)"
)


def models_check(args: argparse.Namespace) -> int:
    """`dlscale models check`: each model's config and files, and with --load its runtime."""
    repo = ModelRepository(args.dir)
    failed = 0
    for result in repo.check():
        error = result.error
        if error is None:
            error = _checked(repo, result.name, args.load)
        if error is None:
            print(f"ok     {result.name} (versions {list(result.versions)})")
        else:
            failed += 1
            print(f"FAILED {result.name}: {error}")
    if not args.load:
        print(f"\n{CHECKED};\n{NOT_CHECKED}.")
    return 1 if failed else 0


def _checked(repo: ModelRepository, name: str, load: bool) -> str | None:
    """What stops the model's versions: their code (always), their runtimes (with `load`)."""
    try:
        for mv in repo.versions(name):
            if mv.config.is_pipeline:  # no runtime of its own: its steps are checked
                continue
            if mv.config.backend == "python":
                from dlscale.backends.python.loader import check_code

                check_code(mv.model_file)
            if load:
                backend = load_for_run(mv)
                reconcile(mv.config, backend.inputs, backend.outputs, mv.source)
                backend.unload()
    except DlscaleError as exc:
        return str(exc)
    return None


def models_convert(args: argparse.Namespace) -> int:
    """`dlscale models convert`: config.toml for each model read from a peer's config or file."""
    repo = ModelRepository(args.dir)
    failed = 0
    for name in args.models or repo.names():
        target = repo.root / name / "config.toml"
        try:
            source = repo.source(name)
        except DlscaleError as exc:
            failed += 1
            print(f"FAILED {name}: {exc}")
            continue
        if source.path == target:
            print(f"skip   {name}: already configured by {target}")
            continue
        text = as_toml(source)
        if args.dry_run:
            print(f"# {target}\n{text}")
            continue
        target.write_text(text)
        left = f" ({len(source.ignored)} fields not carried over)" if source.ignored else ""
        print(f"wrote  {target} from {source.path.name}{left}")
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
