"""The five built-in models and their inputs, outputs and sample data."""

from __future__ import annotations

from dlscale.models.zoo import samples
from dlscale.models.zoo.model import Arrays, ZooModel
from dlscale.types import Datatype, TensorSpec

FP32, INT64 = Datatype.FP32, Datatype.INT64
NETS = "dlscale.models.zoo.nets"
DIGITS_CALIBRATION = 128


def _bert_signature(seq_len: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    return (
        [
            TensorSpec("input_ids", INT64, (seq_len,)),
            TensorSpec("attention_mask", INT64, (seq_len,)),
        ],
        [
            TensorSpec("last_hidden_state", FP32, (seq_len, 768)),
            TensorSpec("pooler_output", FP32, (768,)),
        ],
    )


def _digits_datasets(seq_len: int) -> tuple[Arrays, Arrays]:
    # Calibration from the training images, validation the held-out ones with their labels.
    x_train, _, x_test, y_test = samples.digits_split()
    return {"input": x_train[:DIGITS_CALIBRATION]}, {"input": x_test, "labels": y_test}


def _image_datasets(seq_len: int) -> tuple[Arrays, Arrays]:
    calibration, images, labels = samples.image_sets()
    return {"input": calibration}, {"input": images, "labels": labels}


def _io(width_in: int, width_out: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    return [TensorSpec("input", FP32, (width_in,))], [TensorSpec("output", FP32, (width_out,))]


IDENTITY = ZooModel(
    name="identity",
    description="FP32 [N,16] returned unchanged (one ONNX Identity node)",
    task="identity",
    max_batch_size=1024,
    signature=lambda _: _io(16, 16),
    sampler=lambda n, rng, _: {"input": samples.gaussian(n, rng, 16)},
    factory=f"{NETS}.small:make_identity",
    calibration_size=128,
    validation_size=256,
)
MLP = ZooModel(
    name="mlp",
    description="MLP 256-1024-1024-10 with ReLU",
    task="classification",
    max_batch_size=256,
    signature=lambda _: _io(256, 10),
    sampler=lambda n, rng, _: {"input": samples.gaussian(n, rng, 256)},
    factory=f"{NETS}.small:make_mlp",
    calibration_size=128,
    validation_size=256,
)
DIGITS = ZooModel(
    name="digits",
    description="small CNN trained at build time on scikit-learn's 8x8 digits",
    task="classification",
    max_batch_size=256,
    signature=lambda _: (
        [TensorSpec("input", FP32, (1, 8, 8))],
        [TensorSpec("output", FP32, (10,))],
    ),
    sampler=lambda n, rng, _: {"input": samples.digits_images(n, rng)},
    factory=f"{NETS}.digits:make",
    calibration_size=DIGITS_CALIBRATION,
    validation_size=samples.DIGITS_HELD_OUT,
    datasets=_digits_datasets,
)
RESNET50 = ZooModel(
    name="resnet50",
    description="ResNet-50 v1.5, ImageNet-shaped; seeded body, head fitted to synthetic classes",
    task="classification",
    max_batch_size=64,
    signature=lambda _: (
        [TensorSpec("input", FP32, (3, 224, 224))],
        [TensorSpec("output", FP32, (1000,))],
    ),
    sampler=lambda n, rng, _: {"input": samples.imagenet_like(n, rng)},
    factory=f"{NETS}.resnet:make",
    calibration_size=samples.IMAGE_CALIBRATION,
    validation_size=samples.IMAGE_VALIDATION,
    datasets=_image_datasets,
)
BERT_BASE = ZooModel(
    name="bert-base",
    description="BERT-base encoder and pooler, seeded weights",
    task="embedding",
    max_batch_size=32,
    signature=_bert_signature,
    sampler=lambda n, rng, seq_len: samples.bert_tokens(n, rng, seq_len),
    factory=f"{NETS}.bert:make",
    calibration_size=64,
    validation_size=128,
    seq_lens=(2, 512),  # [CLS] and [SEP] at least; BERT-base has 512 positions
)

ZOO: dict[str, ZooModel] = {m.name: m for m in (IDENTITY, MLP, DIGITS, RESNET50, BERT_BASE)}
