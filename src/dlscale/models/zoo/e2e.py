"""The zoo's end-to-end pipelines: JPEG bytes in, top-5 labels out; text in, a class out.

Each is built by code into a model repository as separate models, the steps and the pipeline
over them (docs/zoo.md): `<name>-image` or `<name>-tokenizer`, the classifier, `<name>-topk`
with its labels file, and `<name>` itself. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlscale.models.zoo.catalog import RESNET50
from dlscale.models.zoo.e2e_text import text_pipeline, text_signature
from dlscale.models.zoo.images import IMAGE_CLASSES, IMAGENET_MEAN, IMAGENET_STD
from dlscale.models.zoo.model import ZooModel
from dlscale.models.zoo.samples import imagenet_like
from dlscale.models.zoo.steps import write_pipeline, write_step, write_topk
from dlscale.models.zoo.tf_zoo import TF_IMAGE
from dlscale.types import Datatype, TensorSpec

#: Every e2e pipeline and its steps batch up to this many rows.
E2E_BATCH = 64
TOP_K = 5
SMALLCNN = ZooModel(
    name="smallcnn",
    description="3-layer CNN over 64x64 images of the synthetic classes (5.7 MFLOP)",
    task="classification",
    max_batch_size=E2E_BATCH,
    signature=lambda _: (
        [TensorSpec("input", Datatype.FP32, (3, 64, 64))],
        [TensorSpec("output", Datatype.FP32, (IMAGE_CLASSES,))],
    ),
    sampler=lambda n, rng, _: {"input": imagenet_like(n, rng, 64)},
    factory="dlscale.models.zoo.nets.smallcnn:make",
    calibration_size=16,
    validation_size=32,
)


@dataclass(frozen=True)
class ZooPipeline:
    """An end-to-end zoo entry: a pipeline and the models it runs, built together."""

    name: str
    description: str
    task: str
    #: (inputs, outputs): what the pipeline answers.
    signature: tuple[list[TensorSpec], list[TensorSpec]]
    #: The models the pipeline runs, in step order (folders beside it in the repository).
    parts: tuple[str, ...]
    builder: Callable[[Path], None]

    def build(self, root: Path, seq_len: int = 0) -> Path:
        """Write the pipeline and its parts into `root`; a classifier already there is reused.
        `seq_len` is the zoo's common argument, unused."""
        del seq_len
        root.mkdir(parents=True, exist_ok=True)
        self.builder(root)
        return root / self.name


def synthetic_labels(count: int) -> list[str]:
    """Labels of an image classifier's outputs: the synthetic classes by name, then unused."""
    return [f"pattern-{i:02d}" if i < IMAGE_CLASSES else f"unused-{i:04d}" for i in range(count)]


def image_pipeline(
    root: Path, name: str, classifier: ZooModel, resize: int, crop: int, device: str = "cpu"
) -> None:
    """JPEG (or PNG) bytes -> `name`-image -> `classifier` -> `name`-topk -> top-5 labels.

    On a CUDA `device` the image step decodes with nvJPEG and hands its pixels on in device
    memory to `name`-classifier, the classifier on the torch backend on the same device.
    """
    if device != "cpu":
        _torch_classifier(root, f"{name}-classifier", classifier, device)
    elif not (root / classifier.name / "1" / "model.onnx").is_file():
        classifier.build(root)  # a classifier already built is reused
    classes = classifier.outputs()[0].shape[0]
    options: dict[str, object] = {"resize": resize, "crop": crop}
    _image_steps(root, name, classifier.name, "output", classes, options, image_signature(), device)


def _image_steps(
    root: Path,
    name: str,
    classifier: str,
    output: str,
    classes: int,
    options: dict[str, object],
    signature: tuple[list[TensorSpec], list[TensorSpec]],
    device: str = "cpu",
) -> None:
    """`name`-image (`options`, then ImageNet's normalization), `name`-topk over the `classes`
    scores in the classifier's `output`, and the pipeline `name` over the three steps, which
    answers `signature`. The classifier's step is `classifier`, or on a CUDA `device` the
    `name`-classifier that serves it there."""
    normalize = {"mean": IMAGENET_MEAN.ravel().tolist(), "std": IMAGENET_STD.ravel().tolist()}
    on_device = {} if device == "cpu" else {"device_output": True}
    options = {**options, **normalize, **on_device}
    write_step(root, f"{name}-image", "image", E2E_BATCH, options, device=device)
    write_topk(root, f"{name}-topk", E2E_BATCH, TOP_K, synthetic_labels(classes))
    model = classifier if device == "cpu" else f"{name}-classifier"
    write_pipeline(
        root,
        name,
        E2E_BATCH,
        signature,
        [
            (f"{name}-image", {"image": "image"}, {"pixels": "pixels"}),
            (model, {"input": "pixels"}, {output: "scores"}),
            (f"{name}-topk", {"scores": "scores"}, {"labels": "labels"}),
        ],
        {"zoo": "true", "task": "classification", "classifier": classifier},
    )


def _torch_classifier(root: Path, name: str, classifier: ZooModel, device: str) -> None:
    """`classifier` served by the torch backend on `device`, built from its code at load."""
    from dlscale.models.zoo.inputs import torch_entry

    entry = torch_entry(classifier)
    folder = write_step(
        root,
        name,
        "torch",
        E2E_BATCH,
        {},
        {},  # the module spec is written next
        (classifier.inputs(), classifier.outputs()),
        device,
    )
    entry.write(folder / "1" / "model.zoo")


def image_signature(scores: bool = False) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The image pipelines' tensors: one encoded image per row in, its top-5 labels out (after
    its scores over the synthetic classes, with `scores`: tf-image-e2e's)."""
    labels = TensorSpec("labels", Datatype.BYTES, (TOP_K,))
    answers = (
        [TensorSpec("scores", Datatype.FP32, (IMAGE_CLASSES,)), labels] if scores else [labels]
    )
    return [TensorSpec("image", Datatype.BYTES, (1,))], answers


def _image_e2e(name: str, classifier: ZooModel, resize: int, crop: int) -> ZooPipeline:
    """JPEG bytes -> the image step (resize the shorter side, centre crop) -> classifier ->
    the top-k step's top-5 labels."""
    net = classifier.name
    return ZooPipeline(
        name=name,
        description=f"JPEG bytes -> decode, resize {resize}, crop {crop} -> {net} -> top-5 labels",
        task="image classification",
        signature=image_signature(),
        parts=(f"{name}-image", net, f"{name}-topk"),
        builder=lambda root: image_pipeline(root, name, classifier, resize, crop),
    )


SMALLCNN_E2E = _image_e2e("smallcnn-e2e", SMALLCNN, 73, 64)
RESNET50_E2E = _image_e2e("resnet50-e2e", RESNET50, 256, 224)

BERT_E2E = ZooPipeline(
    name="bert-e2e",
    description="text -> WordPiece tokens (32) -> BERT-base classifier -> its topic",
    task="text classification",
    signature=text_signature(),
    parts=("bert-e2e-tokenizer", "bert-e2e-classifier", "bert-e2e-topk"),
    builder=lambda root: text_pipeline(root, "bert-e2e"),
)


class TFPipeline(ZooPipeline):
    """A pipeline whose classifier is a TensorFlow model: built with the [tensorflow] extra."""


def tf_image_pipeline(root: Path, name: str) -> None:
    """JPEG bytes -> `name`-image (NHWC, ImageNet normalization) -> tf-image -> `name`-topk;
    the pipeline answers the scores and the top-5 labels. tf-image already there is reused."""
    if not (root / TF_IMAGE.name / "1" / TF_IMAGE.file / "saved_model.pb").is_file():
        TF_IMAGE.build(root)
    options: dict[str, object] = {
        "resize": 73,  # as smallcnn-e2e: the crop of tf-image's side from a shorter side of 73
        "crop": TF_IMAGE.inputs[0].shape[0],
        "layout": "NHWC",  # TensorFlow's own layout: what tf-image's convolutions take
    }
    signature = image_signature(scores=True)
    _image_steps(root, name, TF_IMAGE.name, "scores", IMAGE_CLASSES, options, signature)


TF_IMAGE_E2E = TFPipeline(
    name="tf-image-e2e",
    description="JPEG bytes -> decode, resize 73, crop 64, NHWC -> tf-image -> scores, top-5",
    task="image classification",
    signature=image_signature(scores=True),
    parts=("tf-image-e2e-image", TF_IMAGE.name, "tf-image-e2e-topk"),
    builder=lambda root: tf_image_pipeline(root, "tf-image-e2e"),
)

PIPELINES: dict[str, ZooPipeline] = {
    p.name: p for p in (SMALLCNN_E2E, RESNET50_E2E, BERT_E2E, TF_IMAGE_E2E)
}
