"""Loading a SavedModel folder or a Keras 3 file as one callable with named tensors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from dlscale.backends.tensorflow.graphs import check_known_ops, parse
from dlscale.backends.tensorflow.tensors import TF_DTYPES, spec_of
from dlscale.errors import ConfigError
from dlscale.types import TensorSpec

#: The signature Triton's TensorFlow backend and TF Serving call when none is named.
DEFAULT_SIGNATURE = "serving_default"

#: One batch: named tensors in, named tensors out.
Call = Callable[..., dict[str, Any]]


@dataclass
class LoadedModel:
    """A model ready to call with keyword tensors, and the tensors it takes and gives."""

    call: Call
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    #: What keeps the model's variables alive (the loaded object or the Keras model).
    owner: Any


def load_model(path: Path, signature: str, jit_compile: bool) -> LoadedModel:
    """The model at `path`: a SavedModel folder (its named signature) or a `.keras` file."""
    if path.suffix == ".keras":
        if signature != DEFAULT_SIGNATURE:
            raise ConfigError(
                f"{path}: backend_options.signature names a SavedModel signature; a .keras "
                "file has one call, its model's"
            )
        return _keras(path, jit_compile)
    return _saved_model(path, signature, jit_compile)


def _saved_model(path: Path, signature: str, jit_compile: bool) -> LoadedModel:
    graph = path / "saved_model.pb"
    if not graph.is_file():
        raise ConfigError(f"{path}: not a SavedModel folder (it has no saved_model.pb)")
    check_known_ops(parse(graph.read_bytes(), str(path)), str(path))
    try:
        loaded = tf.saved_model.load(str(path), tags=["serve"])
    except Exception as exc:  # TensorFlow raises many kinds for a bad folder
        raise ConfigError(f"{path}: TensorFlow cannot load the SavedModel: {exc}") from None
    signatures = dict(getattr(loaded, "signatures", {}))
    if signature not in signatures:
        raise ConfigError(
            f"{path}: the SavedModel has no signature {signature!r} (it has "
            f"{sorted(signatures)}); name one in backend_options.signature"
        )
    function = signatures[signature]
    _, named = function.structured_input_signature
    inputs = [spec_of(name, spec, str(path)) for name, spec in sorted(named.items())]
    outputs = [
        spec_of(name, spec, str(path)) for name, spec in sorted(function.structured_outputs.items())
    ]
    call: Call = function
    if jit_compile:
        call = tf.function(lambda **kw: function(**kw), jit_compile=True)
    return LoadedModel(call, inputs, outputs, loaded)


def _keras(path: Path, jit_compile: bool) -> LoadedModel:
    import keras  # with TensorFlow as its backend (Keras 3's default when TF is installed)

    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"{path}: Keras runs on {keras.backend.backend()!r} here (KERAS_BACKEND); the "
            "tensorflow backend needs KERAS_BACKEND=tensorflow"
        )
    try:
        # safe_mode: a Lambda layer's Python (marshalled bytecode) is refused, not run.
        model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:  # Keras raises ValueError, TypeError, OSError... for a bad file
        raise ConfigError(f"{path}: Keras cannot load it: {exc}") from None
    names = [t.name for t in model.inputs]
    inputs = [spec_of(n, t, str(path)) for n, t in zip(names, model.inputs, strict=True)]
    out_names = list(model.output_names)
    outputs = [spec_of(n, t, str(path)) for n, t in zip(out_names, model.outputs, strict=True)]
    specs = [tf.TensorSpec(_tf_shape(s), TF_DTYPES[s.datatype], s.name) for s in inputs]

    def run(*args: Any) -> Any:
        return model(list(args) if len(args) > 1 else args[0], training=False)

    forward = tf.function(run, input_signature=specs, jit_compile=jit_compile)

    def call(**kw: Any) -> dict[str, Any]:
        result = forward(*(kw[n] for n in names))
        if isinstance(result, dict):
            return dict(result)
        results = result if isinstance(result, list | tuple) else [result]
        return dict(zip(out_names, results, strict=True))

    return LoadedModel(call, inputs, outputs, model)


def _tf_shape(spec: TensorSpec) -> list[int | None]:
    return [None if d < 0 else d for d in spec.shape]
