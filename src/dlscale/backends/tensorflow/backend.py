"""TensorFlow backend: a SavedModel's named signature, or a Keras 3 model, on CPU or a GPU."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.backends.tensorflow.files import DEFAULT_SIGNATURE, LoadedModel, load_model
from dlscale.backends.tensorflow.runtime import bound_threads, place
from dlscale.backends.tensorflow.tensors import to_numpy, to_tf
from dlscale.errors import BackendError, ConfigError, InvalidInput
from dlscale.types import TensorSpec

log = logging.getLogger(__name__)

#: The [backend_options] this backend reads besides the thread counts.
OPTIONS = {
    "signature": "the SavedModel signature to serve (default serving_default)",
    "jit_compile": "compile the model with XLA (true/false, default false)",
}


def parse_options(extra: Mapping[str, Any]) -> tuple[str, bool]:
    """(signature, jit_compile) from [backend_options]; a ConfigError names a wrong one."""
    unknown = sorted(set(extra) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"backend_options {unknown}: the tensorflow backend reads {sorted(OPTIONS)} "
            "(and intra_op_threads, inter_op_threads)"
        )
    signature = extra.get("signature", DEFAULT_SIGNATURE)
    jit = extra.get("jit_compile", False)
    if not isinstance(signature, str) or not signature:
        raise ConfigError(f"backend_options.signature: expected a name, got {signature!r}")
    if not isinstance(jit, bool):
        raise ConfigError(f"backend_options.jit_compile: expected true or false, got {jit!r}")
    return signature, jit


class TensorflowBackend:
    """One loaded SavedModel or Keras model; TensorFlow releases the GIL while it computes."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = Path(path)
        self.options = options
        self.signature, self.jit_compile = parse_options(options.extra)
        self._model: LoadedModel | None = None
        #: The signature's tensors, read at load.
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self._device = ""
        self._specs: dict[str, TensorSpec] = {}

    def load(self) -> None:
        """Read the model and its signature; place it on the configured device."""
        bound_threads(self.options.intra_op_threads, self.options.inter_op_threads)
        self._device = place(self.options.device)
        with tf.device(self._device):
            self._model = load_model(self.path, self.signature, self.jit_compile)
        self.inputs, self.outputs = self._model.inputs, self._model.outputs
        self._specs = {s.name: s for s in self.inputs}
        log.debug("loaded %s on %s (XLA %s)", self.path, self._device, self.jit_compile)

    @property
    def capabilities(self) -> Capabilities:
        """One batch at a time per instance, on host arrays."""
        return Capabilities()

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; every output of the signature is returned."""
        if self._model is None:
            raise BackendError(f"{self.path}: infer called before load")
        try:
            with tf.device(self._device):
                results = self._model.call(**to_tf(self._specs, inputs))
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            raise InvalidInput(f"the model refused the inputs: {_first_line(exc)}") from exc
        except Exception as exc:
            raise BackendError(f"TensorFlow failed: {_first_line(exc)}") from exc
        return {spec.name: to_numpy(results[spec.name]) for spec in self._model.outputs}

    def unload(self) -> None:
        """Drop the model (TensorFlow frees its variables when the last reference goes)."""
        self._model = None
        self.inputs, self.outputs = [], []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
