"""The servers a benchmark measures, each a process of its own: started, polled, stopped.

A server process of ours prints `LISTENING <port>` once it serves (`announce`); `start_listening`
starts one and reads that line. `dlscale serve` is started as a user runs it (`start_dlscale`;
`start_ray` with `--ray`; revisions.py's `start_revision` from another checkout), peers with
`start_triton` and `start_mlserver`. Every one that listens over HTTP is waited for by the one
poll, `wait_ready`, and each is stopped by its process id (`ServerProcess.stop`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.harness import peers
from benchmarks.harness.models import RESNET50

WORK = Path(".bench")
RESULTS = Path("bench-results")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
HOST = "127.0.0.1"


@dataclass
class ServerProcess:
    """A server process started for one round, and the port it listens on."""

    name: str
    proc: subprocess.Popen[str]
    port: int

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to its process group if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time so far of a process and its descendants (a peer's tritonserver
    runs under the Python process that started it); gone children no longer count."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def free_port() -> int:
    """A loopback port free now (for servers that cannot be asked for port 0)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def thread_env(**extra: str) -> dict[str, str]:
    """This process's environment with one math-library thread per process, plus `extra`."""
    return {**os.environ, **THREAD_ENV, **extra}


def announce(port: int) -> None:
    """What a server process prints once it serves: the line start_listening waits for."""
    print(f"LISTENING {port}", flush=True)


def start_listening(name: str, argv: list[str], **env: str) -> ServerProcess:
    """A Python server process that announces its port; killed if it does not."""
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=thread_env(**env),
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("LISTENING"):
        proc.kill()
        raise RuntimeError(f"{name} did not start: {line!r}")
    return ServerProcess(name, proc, int(line.split()[1]))


def wait_ready(
    server: ServerProcess,
    paths: list[str] | None = None,
    timeout_s: float = 300,
    every_s: float = 0.5,
) -> None:
    """Return once each of `paths` (default: the server's readiness) answers 200; stop the
    server and raise if it exits or `timeout_s` passes first."""
    # A model's own endpoint, not the server's: Triton says it is ready before its models are.
    pending = list(paths or ["/v2/health/ready"])
    deadline = time.monotonic() + timeout_s
    while pending:
        if server.proc.poll() is not None or time.monotonic() > deadline:
            code = server.proc.poll()
            server.stop()
            why = f"exited with {code}" if code is not None else f"not ready in {timeout_s:.0f} s"
            raise RuntimeError(f"{server.name} did not become ready ({why}; run it by hand)")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{server.port}{pending[0]}", timeout=2) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(every_s)


def model_paths(model_names: list[str]) -> list[str]:
    """The readiness endpoint of each model."""
    return [f"/v2/models/{m}/ready" for m in model_names]


def start_mlserver(folder: Path, port: int, model_names: list[str]) -> ServerProcess:
    """MLServer serving `folder` (peers.mlserver_repository); returns once every model is ready."""
    exe = peers.ensure_mlserver()
    proc = subprocess.Popen(
        [str(exe.resolve()), "start", "."],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=thread_env(PYTHONPATH=str(folder.resolve())),
        start_new_session=True,
    )
    server = ServerProcess("mlserver", proc, port)
    wait_ready(server, model_paths(model_names), timeout_s=180)
    return server


def serve_argv(repo: Path, http: int, grpc: int) -> list[str]:
    """`dlscale serve REPO` on the given ports, without metrics, as a user types it."""
    argv = [sys.executable, "-m", "dlscale", "serve", str(repo), "--http-port", str(http)]
    return [*argv, "--grpc-port", str(grpc), "--metrics-port", "-1"]


def start_dlscale(
    repo: Path, model_names: list[str], extra: tuple[str, ...] = ()
) -> tuple[ServerProcess, int, int]:
    """`dlscale serve --allow-client-shm` (plus `extra` flags) on free ports, once every model
    is ready; returns the server and its HTTP and gRPC ports."""
    http, grpc = free_port(), free_port()
    argv = [*serve_argv(repo, http, grpc), "--allow-client-shm", "--log-level", "WARNING", *extra]
    proc = subprocess.Popen(argv, env=thread_env(), start_new_session=True, text=True)
    server = ServerProcess("dlscale", proc, http)
    wait_ready(server, model_paths(model_names))
    return server, http, grpc


def start_triton(repo: Path, model_names: list[str]) -> tuple[ServerProcess, int, int]:
    """Triton (pytriton) serving the same models on free ports, once every model is ready."""
    python = peers.ensure_pytriton()
    http, grpc = free_port(), free_port()
    script = Path(__file__).resolve().parents[1] / "pytriton_server.py"
    argv = [str(python), str(script), "--http-port", str(http), "--grpc-port", str(grpc)]
    argv += ["--metrics-port", str(free_port())]
    if "resnet50" in model_names:
        argv += ["--resnet", str(RESNET50.path(repo))]
    log = open(WORK / "pytriton.log", "w")  # noqa: SIM115 (the process keeps it open)
    proc = subprocess.Popen(
        argv,
        env=thread_env(**peers.pytriton_env(python)),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    server = ServerProcess("triton", proc, http)
    wait_ready(server, model_paths(model_names))
    return server, http, grpc


def dlscale_exe() -> str:
    """The `dlscale` console script beside this Python."""
    return str(Path(sys.executable).parent / "dlscale")


def start_ray(repo: Path, replicas: int = 1, grpc_port: int | None = None) -> ServerProcess:
    """`dlscale serve REPO --ray` (its own Ray cluster; gRPC on `grpc_port` when given);
    returns once the fleet's router answers ready (a replica serves)."""
    port = free_port()
    grpc = "-1" if grpc_port is None else str(grpc_port)
    argv = [dlscale_exe(), "serve", str(repo), "--ray", "--http-port", str(port),
            "--grpc-port", grpc, "--metrics-port", "-1", "--log-level", "WARNING",
            "--replicas", str(replicas)]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=thread_env(),
        start_new_session=True,
    )
    server = ServerProcess("ray-serve", proc, port)
    wait_ready(server, every_s=1)
    return server


def start_rest_stack(repo: Path, stack: str = "protocol") -> ServerProcess:
    """dlscale's REST server (benchmarks/serve_http.py) with one HTTP stack."""
    port = free_port() if stack == "granian" else 0
    loop = "asyncio" if stack.endswith("-asyncio") else "uvloop"
    argv = ["--stack", stack.removesuffix("-asyncio"), "--port", str(port), "--loop", loop]
    return start_listening(f"dlscale-{stack}", ["-m", "benchmarks.serve_http", str(repo), *argv])


def run_script(name: str, argv: list[str]) -> int:
    """Another benchmark script, `python -m benchmarks.NAME ARGV`, as a child: scripts never
    import each other."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *argv]).returncode


# -- the JPEG pipeline's peers (benchmarks/e2e_pipeline.py) --------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def start_pytriton_e2e(repo: Path, model: str) -> ServerProcess:
    """Triton (pytriton) serving the JPEG pipeline as one Python callable (harness/pytriton_e2e.py),
    once the model is ready; the checkout's root and src on its path for e2e_apps."""
    python = peers.ensure_pytriton_e2e()
    http, grpc = free_port(), free_port()
    argv = [str(python), str(ROOT / "benchmarks" / "harness" / "pytriton_e2e.py")]
    argv += ["--repo", str(repo.resolve()), "--http-port", str(http), "--grpc-port", str(grpc)]
    argv += ["--metrics-port", str(free_port())]
    log = open(WORK / "pytriton-e2e.log", "w")  # noqa: SIM115 (the process keeps it open)
    env = thread_env(**peers.pytriton_env(python), PYTHONPATH=f"{ROOT}:{ROOT / 'src'}")
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, text=True
    )
    server = ServerProcess("pytriton", proc, http)
    wait_ready(server, model_paths([model]))
    return server


def start_ray_e2e(repo: Path) -> ServerProcess:
    """Ray Serve composed deployments of the JPEG pipeline (harness/ray_e2e.py), once it serves."""
    port = free_port()
    argv = ["-m", "benchmarks.harness.ray_e2e", "--repo", str(repo), "--port", str(port)]
    # Ray's worker processes import the deployments' module: the checkout's root on their path.
    return start_listening("ray-serve", argv, PYTHONPATH=str(ROOT))
