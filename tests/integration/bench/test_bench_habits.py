"""The README's generative tour, typed as a user types it: `dlscale bench --generative` (the
command, a child process) against a server started with `--api-key`: without the key it says
how to pass one, with a wrong one that it was refused, with the key it runs and each load point
reports its requests with an ETA."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.cli import run_cli
from tests.toolkit.generative import write_colours
from tests.toolkit.server import LocalServer, serving

from dlscale.bench.progress import Countdown

KEY = "sk-tour"
SMALL = ["--generative", "chat", "--model", "colours", "--isl", "4", "--osl", "2",
         "--requests", "3", "--concurrency", "1", "--warmup-requests", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("tour")
    write_colours(root)
    with serving(root, api_key=KEY) as running:
        yield running


def _bench(server: LocalServer, out: Path, *extra: str) -> tuple[int, str]:
    done = run_cli(
        "bench", f"http://{server.http_url}", *SMALL, "--out", str(out), *extra, timeout=300
    )
    return done.returncode, done.stdout + done.stderr


def test_without_the_key_the_bench_says_how_to_pass_it(server: LocalServer, tmp_path: Path) -> None:
    code, said = _bench(server, tmp_path / "none")
    assert code == 1, said
    assert "HTTP 401" in said and "pass --api-key KEY, or set OPENAI_API_KEY" in said
    assert "no Authorization header was sent" in said  # missing, told apart from wrong
    assert "Traceback" not in said
    code, said = _bench(server, tmp_path / "wrong", "--api-key", "sk-guess")
    assert code == 1, said
    assert "is not this server's key" in said and "--api-key or $OPENAI_API_KEY was refused" in said
    assert "sk-guess" not in said  # neither the server nor the bench echoes a key


def test_with_the_key_each_point_ends_with_its_count(server: LocalServer, tmp_path: Path) -> None:
    code, said = _bench(server, tmp_path / "keyed", "--api-key", KEY)
    assert code == 0, said
    assert "concurrency 1: 3/3 requests, " in said and "ETA 0 s" in said


def test_a_countdown_writes_lines_with_an_eta_while_it_runs() -> None:
    stream = io.StringIO()
    with Countdown("concurrency 4", 4, stream=stream, interval_s=0.01) as countdown:
        countdown.done()
        deadline = time.monotonic() + 30  # a safety net: the ticker writes every 10 ms
        while "1/4" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        countdown.done(ok=False)
    lines = stream.getvalue().splitlines()
    assert any(ln.startswith("concurrency 4: 1/4 requests, ") and "ETA " in ln for ln in lines)
    assert lines[-1].startswith("concurrency 4: 2/4 requests, 1 failed, ")
