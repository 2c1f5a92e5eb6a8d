"""The `dlscale` command run as a user runs it: a child process, its output and exit code."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def dlscale_command() -> list[str]:
    """The console script pip installed beside this Python; `python -m dlscale` where there is
    none (a checkout used with PYTHONPATH=src, as on a GPU machine)."""
    script = Path(sys.executable).parent / "dlscale"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dlscale"]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment, with unbuffered output so that a log line is seen when it is
    written. PYTHONPATH is made absolute, so that a child started in another folder still runs
    this checkout's code (`PYTHONPATH=src pytest ...`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    if env.get("PYTHONPATH"):
        paths = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
    return env


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """`dlscale ARGS...` to its end; stdout and stderr captured as text."""
    return subprocess.run(
        [*dlscale_command(), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(),
        timeout=timeout,
        check=False,
    )


LISTEN = re.compile(r"(http|grpc|metrics) listening on 127\.0\.0\.1:(\d+)")
LOADED = re.compile(r"dlscale\.server: server (not )?ready")


class ServeProcess:
    """`dlscale serve REPO --http-port 0 --grpc-port 0 --metrics-port 0 [ARGS...]` as a child
    process, its log read line by line as it runs (the ports it bound are read from it)."""

    def __init__(self, repo: Path | None, *args: str) -> None:
        ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
        given = [] if repo is None else [str(repo)]  # None: ARGS name it (--model-repository)
        self.proc = subprocess.Popen(
            [*dlscale_command(), "serve", *given, *ports, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(),
        )
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = LISTEN.search(line)
            if found:
                self.ports[found.group(1)] = int(found.group(2))

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the three ports are open and every model asked for has loaded or failed (the
        server says `server ready`, or `server not ready` when one failed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("dlscale serve exited:\n" + self.log())
            loaded = any(LOADED.search(line) for line in self.lines)
            if loaded and {"http", "grpc", "metrics"} <= set(self.ports):
                return
            time.sleep(0.1)
        raise AssertionError("not ready in time:\n" + self.log())

    def wait_for(self, text: str, timeout_s: float = 60.0) -> None:
        """Until a line of the log holds `text`."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged in time:\n" + self.log())
            time.sleep(0.05)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Until `condition()` holds (checked every 50 ms), while the process runs."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("condition not met in time:\n" + self.log())
            time.sleep(0.05)

    @property
    def http_url(self) -> str:
        """host:port of the REST frontend, as tritonclient wants it."""
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def metrics(self) -> str:
        """One scrape of the Prometheus endpoint."""
        url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())

    def metric(self, sample: str, labels: dict[str, str]) -> float | None:
        """The value of one sample (`name`, `name_count`, ...) with exactly these labels in a
        scrape now; None when there is none."""
        for family in text_string_to_metric_families(self.metrics()):
            for found in family.samples:
                # The parser names a typed counter's samples NAME_total; the server sends Triton's
                # bare names (checked in tests/integration/observe/test_server_metrics.py).
                if found.name in (sample, f"{sample}_total") and found.labels == labels:
                    return float(found.value)
        return None

    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        """Stop the process if it still runs (a test's clean-up): SIGTERM as a user's supervisor
        sends it, so that it exits as it would (coverage data written); killed if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self._reader.join(10)


@contextmanager
def served(repo: Path | None, *args: str) -> Iterator[ServeProcess]:
    """A ready `dlscale serve` child process, stopped at the end if the test left it running."""
    process = ServeProcess(repo, *args)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()
