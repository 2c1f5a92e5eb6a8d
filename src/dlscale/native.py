"""Native libraries whose load order matters in one process: Triton before TensorFlow.

TensorFlow and Triton (torch.compile's kernels) each bundle LLVM. Whichever loads second
registers LLVM's options again, and LLVM aborts the process ("Option ... registered more than
once") when TensorFlow's came first; Triton first works. Every path that loads TensorFlow (the
TensorFlow backend, TensorFlow Serving's gRPC stubs) calls `before_tensorflow` first, so that a
server (or a test process) that later compiles a torch model does not abort.
"""

from __future__ import annotations

import contextlib


def before_tensorflow() -> None:
    """Load Triton, where it is installed, so that TensorFlow loads after it."""
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
