"""TensorFlow backend: SavedModel folders and Keras 3 files (docs/backends.md, TensorFlow).

TensorFlow and Triton (torch.compile's kernels) each bundle LLVM. Whichever loads second
registers LLVM's options again, and LLVM aborts the process ("Option ... registered more than
once") when TensorFlow's came first; Triton first works. So Triton, where it is installed, is
imported here before anything of TensorFlow's: every module of this package, and `imports` for
code outside it, loads TensorFlow after this.
"""

import contextlib

with contextlib.suppress(ImportError):
    import triton  # noqa: F401

from dlscale.backends.tensorflow.backend import TensorflowBackend

__all__ = ["TensorflowBackend"]
