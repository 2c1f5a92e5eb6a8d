"""TensorFlow backend: SavedModel folders and Keras 3 files (docs/backends.md, TensorFlow).

Triton is loaded before anything of TensorFlow's (dlscale/native.py says why): every module of
this package, and `imports` for code outside it, loads TensorFlow after this.
"""

from dlscale.native import before_tensorflow

before_tensorflow()

from dlscale.backends.tensorflow.backend import TensorflowBackend  # noqa: E402

__all__ = ["TensorflowBackend"]
