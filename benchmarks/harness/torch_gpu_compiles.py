"""benchmarks.torch_gpu's package compiles: each a `package` job of that script in a background
process, a few at a time, its log kept in OUT (a failed compile says why after the run)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


class Compiles:
    """Package jobs running in background processes, a few at a time."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.waiting = list(args.packages)
        self.running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.done: dict[str, Path] = {}
        threads = max(1, (os.cpu_count() or 4) // max(1, args.workers))
        self.env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}

    def poll(self) -> None:
        """Collect finished jobs and start waiting ones."""
        for spec, (proc, folder) in list(self.running.items()):
            if proc.poll() is not None:
                self.done[spec] = folder
                del self.running[spec]
        while self.waiting and len(self.running) < self.args.workers:
            spec = self.waiting.pop(0)
            folder = self.root / spec.replace(":", "-")
            folder.mkdir(parents=True)
            command = [sys.executable, "-m", "benchmarks.torch_gpu", "package", "--spec", spec]
            command += ["--dir", str(folder), "--device", self.args.device]
            command += ["--batch", str(self.args.batch)]
            # In OUT, not the temporary folder: a compile that fails says why after the run.
            log = (self.args.out / f"compile-{spec.replace(':', '-')}.log").open("wb")
            self.running[spec] = (
                subprocess.Popen(command, stdout=log, stderr=log, env=self.env),
                folder,
            )

    @property
    def busy(self) -> bool:
        self.poll()
        return bool(self.running or self.waiting)

    def wait_for(self, spec: str, deadline: float) -> None:
        """Until the job of `spec` is done or the deadline passes (the job then runs on)."""
        while spec not in self.done and self.busy and time.perf_counter() < deadline:
            time.sleep(0.5)

    def wait(self, deadline: float) -> None:
        """Until every job is done or the deadline passes (then the rest are stopped)."""
        while self.busy and time.perf_counter() < deadline:
            time.sleep(1.0)
        for proc, _ in self.running.values():
            proc.kill()
        self.waiting.clear()
