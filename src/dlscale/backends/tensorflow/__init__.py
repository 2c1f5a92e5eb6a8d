"""TensorFlow backend: SavedModel folders and Keras 3 files (docs/backends.md, TensorFlow)."""

from dlscale.backends.tensorflow.backend import TensorflowBackend

__all__ = ["TensorflowBackend"]
