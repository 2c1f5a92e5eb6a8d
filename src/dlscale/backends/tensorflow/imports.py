"""TensorFlow and Keras for code outside this package: imported here, after the package's own
import has loaded Triton first (see its docstring), so that a process that later compiles a
torch model does not abort."""

import keras
import tensorflow as tf

__all__ = ["keras", "tf"]
