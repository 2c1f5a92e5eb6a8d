"""Server instructions per [1,16] request over real sockets, REST and gRPC, per revision.

    python -m benchmarks.small_socket_instructions [--revisions 5e1d6be main .] [--seconds 20]

`dlscale serve` of each revision (checked out once under .bench/revisions) runs under valgrind's
callgrind with instrumentation off while it starts and warms up (3 s of each load); then, for each
protocol, instrumentation is on for a closed-loop window of `seconds` at 32 in flight (the
clients of benchmarks/harness, outside valgrind), and the figure is the server's instructions in
the window over the requests completed in it, printed with the rows a batch the model computed
meanwhile (Triton's statistics). Unlike CPU time on a shared machine, the count does not move
with the neighbours' load; the requests in flight at the window's two edges make it uncertain by
about 32 / requests. Under valgrind the server is tens of times slower, so batches are fuller
than in a timed run: read it as the cost per request of the path, not of a batch. `--keep DIR`
keeps each window's dump for `callgrind_annotate` (per-function costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import uvloop

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.grpc_clients import grpc_closed_loop, infer_request
from benchmarks.harness.models import SMALL, build_identity_like, write_dlscale_config
from benchmarks.harness.revisions import checkout
from benchmarks.harness.servers import (
    HOST,
    WORK,
    ServerProcess,
    free_port,
    serve_argv,
    thread_env,
    wait_ready,
)

IN_FLIGHT = 32


def _control(pid: int, *command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(pid)], check=True, capture_output=True)


def _window(protocol: str, ports: tuple[int, int], seconds: float) -> int:
    """Requests completed in a closed-loop window of `seconds`."""
    http, grpc = ports
    if protocol == "rest":
        body, headers = SMALL.binary_body(1)
        wire = build_request(HOST, http, f"/v2/models/{SMALL.name}/infer", body, headers)
        result = uvloop.run(closed_loop(HOST, http, wire, IN_FLIGHT, seconds, warmup_s=0.0))
    else:
        request, _ = infer_request(SMALL, 1)
        target = f"{HOST}:{grpc}"
        result = asyncio.run(grpc_closed_loop(target, request, IN_FLIGHT, seconds, 0.0))[0]
    return len(result.latencies_s)


def count(
    tree: Path, repo: Path, seconds: float, scratch: Path, keep: Path | None = None
) -> dict[str, float]:
    """Instructions per request of `tree`'s server, by protocol."""
    http, grpc = free_port(), free_port()
    out = scratch / f"callgrind-{tree.name or 'here'}.out"
    argv = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--instr-atstart=no",
            f"--callgrind-out-file={out}", *serve_argv(repo, http, grpc),
            "--log-level", "WARNING"]  # fmt: skip
    env = thread_env(PYTHONPATH=str((tree / "src").resolve()), PYTHONHASHSEED="0")
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    found = {}
    try:
        wait_ready(ServerProcess(tree.name, proc, http), [f"/v2/models/{SMALL.name}/ready"], 900)
        for protocol in ("rest", "grpc"):
            _window(protocol, (http, grpc), 3.0)  # warm
            before = _counts(http)
            dumps = set(scratch.glob(f"{out.name}.*"))
            _control(proc.pid, "-z")
            _control(proc.pid, "-i", "on")
            requests = _window(protocol, (http, grpc), seconds)
            _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")
            rows, batches = (a - b for a, b in zip(_counts(http), before, strict=True))
            new = _new_dump(scratch, out.name, dumps)
            total = sum(
                int(x.split()[1]) for x in new.read_text().splitlines() if x.startswith("totals:")
            )
            found[protocol] = total / max(1, requests)
            if keep is not None:  # for callgrind_annotate: the per-function costs
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(new, keep / f"{tree.resolve().name}-{protocol}.callgrind")
            print(f"{tree.name or '.'} {protocol}: {found[protocol]:,.0f} instructions/request "
                  f"over {requests} requests, {rows / max(1, batches):.1f} rows a batch",
                  flush=True)  # fmt: skip
    finally:
        os.killpg(proc.pid, 9)
    return found


def _counts(http: int) -> tuple[int, int]:
    """The model's rows and batches computed so far (Triton's statistics extension)."""
    url = f"http://{HOST}:{http}/v2/models/{SMALL.name}/stats"
    with urllib.request.urlopen(url, timeout=600) as answer:
        stats = json.load(answer)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def _new_dump(scratch: Path, name: str, before: set[Path]) -> Path:
    for _ in range(300):  # callgrind writes the dump a moment after it is asked
        new = sorted(set(scratch.glob(f"{name}.*")) - before, key=os.path.getmtime)
        if new and new[-1].stat().st_size:
            time.sleep(0.5)
            return new[-1]
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", nargs="+", default=["5e1d6be", "main", "."])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--keep", type=Path, help="a folder to keep each window's callgrind dump")
    args = parser.parse_args(argv)
    WORK.mkdir(exist_ok=True)
    trees = {rev: (Path(".") if rev == "." else checkout(rev)) for rev in args.revisions}
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        build_identity_like(repo, SMALL)
        write_dlscale_config(repo, SMALL)
        counts = {
            rev: count(tree, repo, args.seconds, Path(scratch), args.keep)
            for rev, tree in trees.items()
        }
    first = counts[args.revisions[0]]
    print(
        "\n| revision | REST instructions/request | / first | gRPC instructions/request | / first |"
    )
    print("|---|---|---|---|---|")
    for rev, c in counts.items():
        print(f"| {rev} | {c['rest']:,.0f} | {c['rest'] / first['rest']:.3f} | "
              f"{c['grpc']:,.0f} | {c['grpc'] / first['grpc']:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
