"""Rules on native code that hold for a whole process: library load order, and child processes.

Triton before TensorFlow:

TensorFlow and Triton (torch.compile's kernels) each bundle LLVM. Whichever loads second
registers LLVM's options again, and LLVM aborts the process ("Option ... registered more than
once") when TensorFlow's came first; Triton first works. Every path that loads TensorFlow (the
TensorFlow backend, TensorFlow Serving's gRPC stubs) calls `before_tensorflow` first, so that a
server (or a test process) that later compiles a torch model does not abort.

Children die with their parent: every process dlscale starts to serve beside itself (REST
workers, a fleet's servers, its router) asks Linux for SIGTERM when its parent dies, even by
SIGKILL, so that no orphan holds a port or a device.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

#: prctl(2)'s PR_SET_PDEATHSIG.
_PR_SET_PDEATHSIG = 1


def before_tensorflow() -> None:
    """Load Triton, where it is installed, so that TensorFlow loads after it."""
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401


def die_with_parent() -> None:
    """In a child, between fork and exec (`preexec_fn`): SIGTERM when the parent dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
