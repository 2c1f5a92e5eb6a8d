"""The zoo's TensorFlow entries: tf-image (a SavedModel) and tf-text (a Keras 3 file), served by
the tensorflow backend (tf-image-e2e, the pipeline in front of tf-image, is in e2e.py).

Built by name only, with the [tensorflow] extra (docs/zoo.md); this module imports no
TensorFlow itself: `tf_nets` does, when a model is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.models.zoo.images import IMAGE_CLASSES
from dlscale.models.zoo.model import MAX_QUEUE_DELAY_US, WEIGHT_SEED, build_in_place
from dlscale.types import Datatype, TensorSpec

NETS = "dlscale.models.zoo.tf_nets"
#: Both models batch up to this many rows (as the e2e pipelines: tf-image is one's classifier).
TF_BATCH = 64


@dataclass(frozen=True)
class TFZooModel:
    """A zoo model defined in Keras 3 and written as a SavedModel or a `.keras` file."""

    name: str
    description: str
    task: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: The version folder's file: "model.savedmodel" (a folder) or "model.keras".
    file: str
    #: The `tf_nets` function that makes the Keras model from a seed.
    factory: str

    def keras_model(self, seed: int = WEIGHT_SEED) -> Any:
        """The Keras model every build writes (the same weights for a seed); imports TF."""
        import importlib

        return getattr(importlib.import_module(NETS), self.factory)(seed)

    def build(self, root: Path, seq_len: int = 0) -> Path:
        """Write `root/<name>/` (config.toml, 1/<file>), assembled beside it and moved in at
        the end as the other zoo models are; `seq_len` is the zoo's common argument, unused."""
        del seq_len

        def write(version: Path) -> dict[str, Any]:
            self._save(self.keras_model(), version / self.file)
            return self.config()

        return build_in_place(root, self.name, write)

    def _save(self, model: Any, path: Path) -> None:
        if self.file == "model.keras":
            model.save(str(path))
            return
        from dlscale.backends.tensorflow.imports import keras, tf

        # An export archive rather than model.export: the signature's tensors get the zoo's
        # names ("input" -> "scores") instead of Keras's "output_0".
        spec = self.inputs[0]
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            name="serving_default",
            fn=lambda x: {self.outputs[0].name: model(x, training=False)},
            input_signature=[tf.TensorSpec((None, *spec.shape), tf.float32, name=spec.name)],
        )
        archive.write_out(str(path), verbose=False)

    def config(self) -> dict[str, Any]:
        """config.toml: the tensorflow backend, the tensors (which the backend checks against
        the signature), the zoo's batching and metadata."""
        return {
            "name": self.name,
            "backend": "tensorflow",
            "max_batch_size": self.max_batch_size,
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "batching": {"max_queue_delay_us": MAX_QUEUE_DELAY_US, "preferred_batch_sizes": []},
            "instances": [{"count": 1, "device": "cpu"}],
            # One thread each: TensorFlow's pools spin against the event loop on a small host.
            "backend_options": {"intra_op_threads": 1, "inter_op_threads": 1},
            "metadata": {
                "zoo": "true",
                "task": self.task,
                "description": self.description,
                "seed": WEIGHT_SEED,
            },
        }


TF_IMAGE = TFZooModel(
    name="tf-image",
    description="Keras CNN over 64x64 NHWC images of the synthetic classes, as a SavedModel",
    task="classification",
    max_batch_size=TF_BATCH,
    inputs=(TensorSpec("input", Datatype.FP32, (64, 64, 3)),),
    outputs=(TensorSpec("scores", Datatype.FP32, (IMAGE_CLASSES,)),),
    file="model.savedmodel",
    factory="image_classifier",
)
TF_TEXT = TFZooModel(
    name="tf-text",
    description="Keras token ids -> embedding -> mean -> dense -> 4 classes, as a .keras file",
    task="text classification",
    max_batch_size=TF_BATCH,
    inputs=(TensorSpec("input_ids", Datatype.INT64, (32,)),),
    outputs=(TensorSpec("scores", Datatype.FP32, (4,)),),
    file="model.keras",
    factory="text_classifier",
)
TF_MODELS: dict[str, TFZooModel] = {m.name: m for m in (TF_IMAGE, TF_TEXT)}
