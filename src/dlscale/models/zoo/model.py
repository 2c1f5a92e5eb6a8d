"""`ZooModel`: one built-in model, its inputs, its sample generator and how to build it."""

from __future__ import annotations

import importlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tomli_w

from dlscale.errors import ConfigError
from dlscale.types import TensorSpec

if TYPE_CHECKING:
    import onnx
    from torch import nn

Arrays = dict[str, np.ndarray]
#: (seq_len) → (inputs, outputs), shapes without the batch dimension.
Signature = Callable[[int], tuple[list[TensorSpec], list[TensorSpec]]]
#: (batch, rng, seq_len) → inputs keyed by name.
Sampler = Callable[[int, np.random.Generator, int], Arrays]
#: (seq_len) → (calibration set, validation set), for models with real data.
Datasets = Callable[[int], tuple[Arrays, Arrays]]
MetadataValue = str | int | float

#: Seeds of the weights and of the generated calibration, validation and tracing inputs.
WEIGHT_SEED, CALIBRATION_SEED, VALIDATION_SEED, TRACE_SEED = 0, 1, 2, 3
MAX_QUEUE_DELAY_US = 200
#: Rows per ONNX Runtime call when a labelled validation set is scored at build time.
TOP1_BATCH = 16


@dataclass(frozen=True)
class ZooModel:
    """A built-in model: defined in PyTorch, built into an ONNX repository entry."""

    name: str
    description: str
    task: str
    max_batch_size: int
    signature: Signature
    sampler: Sampler
    #: "module:function" returning (nn.Module, metadata); importing it imports torch.
    factory: str
    calibration_size: int
    validation_size: int
    datasets: Datasets | None = None
    #: Shortest and longest sequence the model takes; None when it has no sequence axis.
    seq_lens: tuple[int, int] | None = None

    def inputs(self, seq_len: int = 128) -> list[TensorSpec]:
        """Input specs, shapes without the batch dimension."""
        return self.signature(seq_len)[0]

    def outputs(self, seq_len: int = 128) -> list[TensorSpec]:
        """Output specs, shapes without the batch dimension."""
        return self.signature(seq_len)[1]

    def sample(self, batch: int, rng: np.random.Generator, *, seq_len: int = 128) -> Arrays:
        """`batch` realistic inputs keyed by input name (numpy only; no torch import)."""
        return self.sampler(batch, rng, seq_len)

    def torch_module(self, seq_len: int = 128) -> nn.Module:
        """The PyTorch module in eval mode, with the same weights as every build.

        The weights do not depend on `seq_len`; BERT's module takes any length it allows.
        """
        self._check_seq_len(seq_len)
        return self.factory_module(WEIGHT_SEED)[0]

    def build(self, root: Path, seq_len: int = 128) -> Path:
        """Write `root/<name>/` (config.toml, 1/model.onnx, calibration and validation sets),
        with `build_in_place`."""
        self._check_seq_len(seq_len)
        return build_in_place(root, self.name, lambda version: self._write(version, seq_len))

    def _check_seq_len(self, seq_len: int) -> None:
        if self.seq_lens is not None and not self.seq_lens[0] <= seq_len <= self.seq_lens[1]:
            low, high = self.seq_lens
            raise ConfigError(f"{self.name}: seq_len must be in [{low}, {high}], got {seq_len}")

    def factory_module(self, seed: int) -> tuple[nn.Module, dict[str, MetadataValue]]:
        """(module, metadata) from the model's factory with weights from `seed`."""
        module_name, func = self.factory.split(":")
        make = getattr(importlib.import_module(module_name), func)
        return make(seed)  # type: ignore[no-any-return]

    def _datasets(self, seq_len: int) -> tuple[Arrays, Arrays]:
        if self.datasets is not None:
            return self.datasets(seq_len)
        calibration = self.sample(
            self.calibration_size, np.random.default_rng(CALIBRATION_SEED), seq_len=seq_len
        )
        validation = self.sample(
            self.validation_size, np.random.default_rng(VALIDATION_SEED), seq_len=seq_len
        )
        return calibration, validation

    def _write(self, version: Path, seq_len: int) -> dict[str, Any]:
        from dlscale.models.zoo.export import add_metadata, export_onnx, save_npz, save_onnx

        module, extra = self.factory_module(WEIGHT_SEED)
        metadata: dict[str, MetadataValue] = {
            "zoo": "true",
            "task": self.task,
            "description": self.description,
            "seed": WEIGHT_SEED,
            **extra,
        }
        if self.seq_lens is not None:
            metadata["seq_len"] = seq_len
        example = self.sample(2, np.random.default_rng(TRACE_SEED), seq_len=seq_len)
        outputs = [spec.name for spec in self.outputs(seq_len)]
        proto = export_onnx(module, example, outputs)
        calibration, validation = self._datasets(seq_len)
        if "labels" in validation and "top1" not in metadata:
            metadata["top1"] = round(_top1(proto, validation), 4)
            metadata["held_out"] = len(validation["labels"])
        add_metadata(proto, {f"dlscale.{k}": str(v) for k, v in metadata.items()})
        save_onnx(proto, version / "model.onnx")
        save_npz(version / "calibration.npz", calibration)
        save_npz(version / "validation.npz", validation)
        return self.config(seq_len, metadata)

    def config(self, seq_len: int, metadata: dict[str, MetadataValue]) -> dict[str, Any]:
        """The config.toml contents for this model (the lead's parser validates them)."""
        inputs, outputs = self.signature(seq_len)
        return {
            "name": self.name,
            "backend": "onnxruntime",
            "max_batch_size": self.max_batch_size,
            "inputs": [spec.to_dict() for spec in inputs],
            "outputs": [spec.to_dict() for spec in outputs],
            "batching": {"max_queue_delay_us": MAX_QUEUE_DELAY_US, "preferred_batch_sizes": []},
            "instances": [{"count": 1, "device": "cpu"}],
            "metadata": metadata,
        }


def build_in_place(root: Path, name: str, write: Callable[[Path], dict[str, Any]]) -> Path:
    """Write `root/<name>/`: `write` fills the version folder `1/` and returns config.toml's
    contents; returns the folder.

    The folder is assembled beside its final place and moved in at the end, so a reader (a
    server polling the repository) never sees a half-written model; an existing folder of that
    name is replaced.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as tmp:
        staging = Path(tmp) / name
        (staging / "1").mkdir(parents=True)
        config = write(staging / "1")
        (staging / "config.toml").write_text(tomli_w.dumps(config))
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    return final


def _top1(proto: onnx.ModelProto, validation: Arrays) -> float:
    """Top-1 of the built ONNX model's first output against the validation labels."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name: validation[i.name] for i in session.get_inputs()}
    labels = validation["labels"]
    hits = 0
    # A few images per call keep the memory of a large model's activations small.
    for start in range(0, len(labels), TOP1_BATCH):
        batch = {k: v[start : start + TOP1_BATCH] for k, v in inputs.items()}
        predicted = session.run(None, batch)[0].argmax(axis=1)
        hits += int(np.sum(predicted == labels[start : start + TOP1_BATCH]))
    return hits / len(labels)
