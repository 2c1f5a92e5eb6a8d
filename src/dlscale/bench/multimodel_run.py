"""`dlscale bench multimodel`: the Zipf mix against a server under a memory budget, and the same
requests against a server holding every model (docs/memory.md, BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

import httpx

from dlscale.bench.multimodel import IndexSampler, Mix, Phase, bodies, drive
from dlscale.bench.multimodel_report import summary, write
from dlscale.bench.results import out_dir
from dlscale.bench.scenarios import parse_duration
from dlscale.bench.tenants import TenantServer, copy_model
from dlscale.errors import BenchError, DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.serving.memory.sizes import parse_budget

_METRICS = re.compile(r"metrics listening on ([\w.:-]+):(\d+)")
_LOAD_SUM = re.compile(r"^dlscale_model_load_seconds_(sum|count) ([0-9.e+-]+)$", re.M)


class RepoServer(TenantServer):
    """`dlscale serve REPO` with flags of the run, its metrics on a port the OS picks."""

    def __init__(self, repo: Path, flags: list[str], log: Path) -> None:
        super().__init__(repo, None, log, flags=["--metrics-port", "0", *flags])

    def metrics_url(self) -> str | None:
        """Where its metrics are served, read from its log (None before it says)."""
        found = _METRICS.search(self.log.read_text(errors="replace"))
        return f"http://{found.group(1)}:{found.group(2)}" if found else None

    @property
    def pid(self) -> int | None:
        """The server process's id (its RSS is sampled)."""
        return self._process.pid if self._process is not None else None


def copies(source: Path, model: str, count: int, root: Path) -> Path:
    """A repository at `root` with `count` copies of `model` (model-000, ...): each a config of
    its own name and links to the same version folders."""
    try:
        config = ModelRepository(source).config(model)
    except DlscaleError as exc:
        raise BenchError(f"cannot copy model {model!r}: {exc}") from None
    for i in range(count):
        name = f"{model}-{i:03d}"
        copy_model(source / model, config.model_copy(update={"name": name}), root / name)
    return root


def run_phase(
    name: str, url: str, mix: Mix, requests: dict[str, Any], pid: int | None = None
) -> Phase:
    """The mix against the server at `url`, the index sampled throughout."""
    with IndexSampler(url, pid) as sampler:
        sent = asyncio.run(drive(url, mix.schedule(), requests, sampler))
    return Phase(name, sent, sampler.samples)


def mean_load_s(metrics_url: str | None) -> list[float]:
    """The server's mean load time, from its dlscale_model_load_seconds (none without)."""
    if metrics_url is None:
        return []
    found = dict(_LOAD_SUM.findall(httpx.get(f"{metrics_url}/metrics", timeout=10).text))
    count = float(found.get("count", 0))
    return [float(found["sum"]) / count] if count else []


def bench_multimodel(args: argparse.Namespace) -> int:
    """Run the phases, write the report, print its summary."""
    out = out_dir(args.out, "multimodel")
    out.mkdir(parents=True, exist_ok=True)
    repo = args.repo
    if args.copies:
        if not args.model:
            raise BenchError("--copies N needs --model NAME, the model to copy")
        repo = copies(args.repo, args.model, args.copies, out / "repository")
    models = tuple(ModelRepository(repo).names())
    mix = Mix(models, args.zipf, args.rate, parse_duration(args.duration), args.seed)
    budget = parse_budget(args.memory_budget)
    flags = ["--model-control", "on-demand", "--memory-budget", args.memory_budget]
    with RepoServer(repo, ["--model-control", "none"], out / "all-resident.log") as every:
        every.wait_ready()
        requests = bodies(every.url, models)
        baseline = run_phase("all-resident", every.url, mix, requests, every.pid)
    with RepoServer(repo, flags, out / "budget.log") as budgeted:
        phase = run_phase("budget", budgeted.url, mix, requests, budgeted.pid)
        phase.budget_bytes = budget.get("cpu")
        phase.load_s = mean_load_s(budgeted.metrics_url())
    figures = [summary(baseline), summary(phase, baseline)]
    write(out, [baseline, phase], figures)
    print((out / "summary.md").read_text())
    return 0
