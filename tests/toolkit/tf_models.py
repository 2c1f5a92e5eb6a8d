"""Small TensorFlow models built from code, deterministic weights: SavedModels and .keras files.

Imported only by tests that have TensorFlow (they `pytest.importorskip("tensorflow")` first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# Through dlscale's package: it loads Triton before TensorFlow (a torch.compile later in the
# same test process would abort otherwise).
from dlscale.backends.tensorflow.imports import keras, tf

#: The dense classifier's widths: 16 features in, 4 scores out.
FEATURES, CLASSES = 16, 4


def dense_model(seed: int = 0) -> Any:
    """A two-layer classifier on FP32 [batch, 16]; input "x", output "scores"."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((FEATURES,), name="x")
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(x)
    scores = keras.layers.Dense(CLASSES, name="scores")(hidden)
    return keras.Model(x, scores)


def write_dense_savedmodel(path: Path, seed: int = 0) -> Any:
    """The classifier as a SavedModel (signature serving_default: x -> output_0); the model."""
    model = dense_model(seed)
    model.export(str(path), verbose=False)
    return model


def write_dense_keras(path: Path, seed: int = 0) -> Any:
    """The classifier as a Keras 3 file; the model."""
    model = dense_model(seed)
    model.save(str(path))
    return model


class _Text(tf.Module):
    """BYTES in and out: each string's length in bytes, and the string upper-cased."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text: Any) -> dict[str, Any]:
        return {"length": tf.strings.length(text), "upper": tf.strings.upper(text)}


def write_text_savedmodel(path: Path) -> None:
    """A string model: text [batch] -> length INT32 [batch], upper BYTES [batch]."""
    module = _Text()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


class _Writer(tf.Module):
    """What an attacker uploads: a signature that writes a file on the host when it runs."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        tf.io.write_file(self.marker, "ran")
        return {"y": x}


def write_file_writing_savedmodel(path: Path, marker: Path) -> None:
    """A SavedModel whose serving signature writes `marker` (tf.io.write_file)."""
    module = _Writer(str(marker))
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def rename_op(path: Path, op: str, new: str) -> None:
    """Rename every `op` node of a SavedModel's functions: what a custom-op library's op looks
    like to a TensorFlow that has not loaded that library."""
    from tensorflow.core.protobuf import saved_model_pb2

    graph = path / "saved_model.pb"
    message = saved_model_pb2.SavedModel()
    message.ParseFromString(graph.read_bytes())
    for function in message.meta_graphs[0].graph_def.library.function:
        for node in function.node_def:
            if node.op == op:
                node.op = new
    graph.write_bytes(message.SerializeToString())


def write_lambda_keras(path: Path, marker: Path) -> None:
    """A .keras file with a Lambda layer whose Python creates `marker` when it runs."""
    x = keras.Input((FEATURES,), name="x")
    touch = f"lambda t: (open({str(marker)!r}, 'w').close(), t)[1]"
    y = keras.layers.Lambda(eval(touch), name="touch")(x)  # the attacker's code, marshalled
    keras.Model(x, y).save(str(path))
    marker.unlink(missing_ok=True)  # building ran it once; the test checks that loading does not


def folder_files(folder: Path, prefix: str) -> dict[str, bytes]:
    """Every file under `folder` as load-request files named `prefix/<relative path>`."""
    return {
        f"{prefix}/{p.relative_to(folder).as_posix()}": p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def reference(model: Any, x: np.ndarray) -> np.ndarray:
    """The Keras model's own answer, in process."""
    return np.asarray(model(x, training=False))


def with_external_weights(keras_file: Path, secret: Path) -> bytes:
    """The .keras file with its first weight stored in `secret` (an HDF5 external dataset):
    what an attacker sends to read a host file into the model's weights, and out as answers."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(keras_file) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    buffer = io.BytesIO(members["model.weights.h5"])
    with h5py.File(buffer, "r+") as weights:
        found: list[str] = []
        weights.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
        shape, dtype = weights[found[0]].shape, weights[found[0]].dtype
        secret.write_bytes(np.ones(shape, dtype).tobytes())
        del weights[found[0]]
        nbytes = int(np.prod(shape)) * dtype.itemsize
        weights.create_dataset(found[0], shape, dtype, external=[(str(secret), 0, nbytes)])
    members["model.weights.h5"] = buffer.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()
