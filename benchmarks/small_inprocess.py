"""Server CPU per [1,16] request in process: `RestApi.handle` in a loop, revisions alternating.

    python -m benchmarks.small_inprocess [--revisions 5e1d6be main .] [--rounds 4] [--seconds 3]
                                         [--concurrency 32] [--profile DIR] [--instructions N]

Each run is a fresh child process (PYTHONPATH at the revision's `src`, checked out once under
.bench/revisions as benchmarks/large.py does) that loads `identity16` (FP32 [1, 16], max batch
32, queue delay 500 us) with every port off, then drives `RestApi.handle` with the binary REST
body the benchmark client sends from `concurrency` coroutines on uvloop for `seconds` after a
second of warm-up. It reports the process's CPU time per request (every thread: the loop and the
instance's), which a loaded machine moves much less than wall time. Revisions alternate within
each round; the table gives the medians and each revision's median ratio to the first.
`--profile DIR` samples each child with py-spy (raw format) into DIR instead of measuring.

`--instructions N` counts instead of timing: each child runs under valgrind's callgrind with
instrumentation off while it starts and warms up, then on for exactly N requests, and the
table gives the instructions executed per request (every thread). The count does not move with
the machine's load (two runs of one revision agree within 0.3 %), which CPU time on a shared
2-core machine does by a third; it weighs every instruction alike (a cache miss counts one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.models import SMALL, build_identity_like, write_dlscale_config
from benchmarks.harness.revisions import checkout
from benchmarks.harness.servers import WORK, thread_env


async def _server(repo: Path) -> Any:
    """A started server of whichever revision is on the path, every port off, models loaded."""
    from dlscale import server as module

    off = {"http_port": None, "grpc_port": None, "metrics_port": None}
    settings_type: Any = module.ServerSettings
    build = getattr(settings_type, "build", None)
    settings = build(repo, **off) if build else settings_type(repo, **off)
    server = module.Server(settings)
    await server.start()
    if hasattr(server, "wait_loaded"):
        await server.wait_loaded()
    freeze = getattr(module, "freeze_survivors", None)
    if freeze is not None:  # as `serve_forever` does once loaded, where the revision does it
        freeze()
    return server


async def _drive(repo: Path, seconds: float, concurrency: int) -> dict[str, float]:
    from dlscale.frontends.rest.api import RestApi

    server = await _server(repo)
    api = RestApi(server.dataplane)
    body, extra = SMALL.binary_body(1)
    headers = {k.lower(): v for k, v in extra.items()} | {"content-type": "application/json"}
    path = f"/v2/models/{SMALL.name}/infer"
    counted = [0]
    stop = [time.perf_counter() + 1.0 + seconds]

    async def client() -> None:
        while time.perf_counter() < stop[0]:
            response = await api.handle("POST", path, headers, body)
            if response.status != 200:
                raise RuntimeError(f"answered {response.status}: {response.parts!r}")
            counted[0] += 1

    tasks = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    await asyncio.sleep(1.0)  # warm-up: every coroutine running, the batcher in its stride
    n0, cpu0, wall0 = counted[0], time.process_time(), time.perf_counter()
    await asyncio.gather(*tasks)
    n, cpu, wall = counted[0] - n0, time.process_time() - cpu0, time.perf_counter() - wall0
    stats = server.dataplane.statistics(SMALL.name)[0]
    await server.stop()
    return {"requests": n, "cpu_us": cpu / n * 1e6, "req_s": n / wall, "all": counted[0],
            "rows_per_batch": stats.inference_count / max(1, stats.execution_count)}  # fmt: skip


async def _counted(repo: Path, requests: int, concurrency: int, flag: Path) -> None:
    """Serve `requests` requests between two files: `flag`.ready (written once warm, with the
    pid, for callgrind to be switched on) and `flag`.done (for it to be switched off)."""
    from dlscale.frontends.rest.api import RestApi

    server = await _server(repo)
    api = RestApi(server.dataplane)
    body, extra = SMALL.binary_body(1)
    headers = {k.lower(): v for k, v in extra.items()} | {"content-type": "application/json"}
    path = f"/v2/models/{SMALL.name}/infer"

    async def drive(count: int) -> None:
        left = [count]

        async def client() -> None:
            while left[0] > 0:
                left[0] -= 1
                response = await api.handle("POST", path, headers, body)
                if response.status != 200:
                    raise RuntimeError(f"answered {response.status}: {response.parts!r}")

        await asyncio.gather(*(client() for _ in range(concurrency)))

    await drive(10 * concurrency)  # warm: the routes, the plan, the batcher's stride
    flag.with_suffix(".ready").write_text(str(os.getpid()))
    while not flag.with_suffix(".go").exists():
        await asyncio.sleep(0.1)
    await drive(requests)
    flag.with_suffix(".done").write_text("")
    while not flag.with_suffix(".end").exists():
        await asyncio.sleep(0.1)
    await server.stop()


def _instructions(tree: Path, repo: Path, requests: int, concurrency: int, scratch: Path) -> int:
    """Instructions callgrind counted over `requests` requests of a child of `tree`."""
    here = Path(__file__).resolve().parents[1]
    env = thread_env(PYTHONPATH=f"{(tree / 'src').resolve()}{os.pathsep}{here}", PYTHONHASHSEED="0")
    flag, out = scratch / f"flag-{tree.name}", scratch / f"callgrind-{tree.name}.out"
    argv = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--instr-atstart=no",
            f"--callgrind-out-file={out}", sys.executable, "-m", "benchmarks.small_inprocess",
            "--child", str(repo), "--instructions", str(requests), "--flag", str(flag),
            "--concurrency", str(concurrency)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(flag.with_suffix(".ready"), proc)
        pid = flag.with_suffix(".ready").read_text()
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        flag.with_suffix(".go").write_text("")
        _wait_for(flag.with_suffix(".done"), proc)
        for command in (["-i", "off"], ["-d"]):
            subprocess.run(["callgrind_control", *command, pid], check=True, capture_output=True)
        flag.with_suffix(".end").write_text("")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    dumps = sorted(scratch.glob(f"{out.name}.*"))  # the dump of the counted requests
    totals = [line for line in dumps[-1].read_text().splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1])


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the child ended ({proc.returncode}) before {path.name}")
        time.sleep(0.2)


def child(repo: Path, seconds: float, concurrency: int) -> None:
    """One measurement in this process; prints its JSON line."""
    import uvloop

    print(json.dumps(uvloop.run(_drive(repo, seconds, concurrency))), flush=True)


def _run_child(
    tree: Path, repo: Path, seconds: float, concurrency: int, spy: Path | None
) -> dict[str, Any]:
    here = Path(__file__).resolve().parents[1]
    env = thread_env(PYTHONPATH=f"{(tree / 'src').resolve()}{os.pathsep}{here}")
    argv = [sys.executable, "-m", "benchmarks.small_inprocess", "--child", str(repo)]
    argv += ["--seconds", str(seconds), "--concurrency", str(concurrency)]
    if spy is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        argv = [py_spy, "record", "--format", "raw", "--rate", "250", "-o", str(spy), "--", *argv]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    line = next(x for x in reversed(out.splitlines()) if x.startswith("{"))  # py-spy prints too
    return dict(json.loads(line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", nargs="+", default=["5e1d6be", "main", "."])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--profile", type=Path, help="py-spy raw samples per revision, here")
    parser.add_argument("--instructions", type=int, help="count instructions over N requests")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--flag", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None and args.flag is not None:
        import uvloop

        uvloop.run(_counted(args.child, args.instructions, args.concurrency, args.flag))
        return 0
    if args.child is not None:
        child(args.child, args.seconds, args.concurrency)
        return 0
    WORK.mkdir(exist_ok=True)
    trees = {rev: (Path(".") if rev == "." else checkout(rev)) for rev in args.revisions}
    runs: dict[str, list[dict[str, Any]]] = {rev: [] for rev in trees}
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        build_identity_like(repo, SMALL)
        write_dlscale_config(repo, SMALL)
        if args.instructions:
            return _count_all(trees, repo, args.instructions, args.concurrency, Path(scratch))
        for rnd in range(args.rounds):
            order = list(trees) if rnd % 2 == 0 else list(trees)[::-1]
            for rev in order:
                spy = None
                if args.profile is not None:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = args.profile / f"{rev.replace('/', '_')}-{rnd}.txt"
                r = _run_child(trees[rev], repo, args.seconds, args.concurrency, spy)
                runs[rev].append(r)
                print(f"round {rnd + 1} {rev}: {r['cpu_us']:.1f} us CPU/request, "
                      f"{r['req_s']:,.0f} req/s, {r['rows_per_batch']:.1f} rows/batch, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    first = args.revisions[0]
    print("\n| revision | CPU us/request (median) | req/s (median) | CPU / first (median) |")
    print("|---|---|---|---|")
    for rev, results in runs.items():
        ratios = [r["cpu_us"] / f["cpu_us"] for r, f in zip(results, runs[first], strict=True)]
        cpu = statistics.median(r["cpu_us"] for r in results)
        rate = statistics.median(r["req_s"] for r in results)
        print(f"| {rev} | {cpu:.1f} | {rate:,.0f} | {statistics.median(ratios):.2f} |")
    return 0


def _count_all(
    trees: dict[str, Path], repo: Path, requests: int, concurrency: int, scratch: Path
) -> int:
    counts = {}
    for rev, tree in trees.items():
        counts[rev] = _instructions(tree, repo, requests, concurrency, scratch) / requests
        print(f"{rev}: {counts[rev]:,.0f} instructions/request", flush=True)
    first = counts[next(iter(counts))]
    print("\n| revision | instructions/request | / first |\n|---|---|---|")
    for rev, count in counts.items():
        print(f"| {rev} | {count:,.0f} | {count / first:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
