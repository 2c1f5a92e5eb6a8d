"""Rules on native code that hold for a whole process: library load order, and child processes.

Triton before TensorFlow:

TensorFlow and Triton (torch.compile's kernels) each bundle LLVM. Whichever loads second
registers LLVM's options again, and LLVM aborts the process ("Option ... registered more than
once") when TensorFlow's came first; Triton first works. Every path that loads TensorFlow (the
TensorFlow backend, TensorFlow Serving's gRPC stubs) calls `before_tensorflow` first, so that a
server (or a test process) that later compiles a torch model does not abort.

Children die with their parent: every process dlscale starts to serve beside itself (REST
workers, a fleet's servers, its router) asks Linux for SIGTERM when its parent dies, even by
SIGKILL, so that no orphan holds a port or a device. They are started without forking the
Python process (`spawn_dying_with_parent`): a fork of a process that runs gRPC (every Ray actor,
every server) runs gRPC's fork handlers, which restart its poller thread in the child; the child
then closes its inherited descriptors before exec, the epoll descriptor among them, and the
poller aborts the child (SIGABRT, "epoll_wait error: Bad file descriptor"), now and then, on a
busy machine: a fleet's router once failed to start that way in CI.

Folders of ended processes: a process killed (SIGKILL, a container stopped, a Ray actor killed)
cannot remove the folders it made in the temporary directory, so each folder is named by its
process's id (`process_folder`) and the next process that makes one of the same kind removes
those of processes that have ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: prctl(2)'s PR_SET_PDEATHSIG.
_PR_SET_PDEATHSIG = 1


def before_tensorflow() -> None:
    """Load Triton, where it is installed, so that TensorFlow loads after it."""
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401


def spawn_dying_with_parent(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start `argv` (Popen's keywords in `popen`) to get SIGTERM when the calling *thread* ends.

    `setpriv --pdeathsig` (util-linux, on every Debian-like host) sets the signal and execs
    `argv`, so Python starts it by vfork, which runs no fork handlers; where there is no setpriv,
    the signal is set between fork and exec instead. setpriv asks for it after the spawn
    returns: a caller whose thread ends at once may end before it (dlscale's wait for their
    children to answer).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return subprocess.Popen([setpriv, "--pdeathsig", "TERM", "--", *argv], **popen)
    return subprocess.Popen(list(argv), preexec_fn=die_with_parent, **popen)


def end_child(process: subprocess.Popen[bytes] | None, grace_s: float) -> bool:
    """SIGTERM a child that still runs; SIGKILL it when it has not ended within `grace_s`.
    Whether it had to be killed."""
    if process is None or process.poll() is not None:
        return False
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return True
    return False


def run_child(
    command: Sequence[str], timeout_s: float, error: type[Exception], timed_out: str
) -> subprocess.CompletedProcess[str]:
    """Run `command` to its end, its output captured as text; `error(timed_out)` when it runs
    past `timeout_s`. Its failure is the caller's to judge, and `stderr_tail` to explain."""
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise error(timed_out) from None


def stderr_tail(done: subprocess.CompletedProcess[str]) -> str:
    """The last three non-blank lines of a child's stderr, joined: what explains its failure."""
    return " | ".join([line for line in done.stderr.splitlines() if line.strip()][-3:])


def die_with_parent() -> None:
    """In this process, or in a child between fork and exec: SIGTERM when the parent (thread)
    ends (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def process_folder(prefix: str, parent: str | None = None) -> Path:
    """A new folder `{prefix}{pid}-...` for this process's files in `parent` (the temporary
    directory by default), after removing this user's folders of that kind there whose process
    has ended."""
    where = Path(parent or tempfile.gettempdir())
    for folder in where.glob(f"{prefix}*-*"):
        pid = folder.name.removeprefix(prefix).partition("-")[0]
        try:
            if not pid.isdigit() or folder.lstat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)  # raises when no such process: its folder is left over
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # another user's process, or the folder went meanwhile
            continue
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where))
