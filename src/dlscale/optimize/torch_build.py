"""The files of the PyTorch variants, built from the zoo's PyTorch definition of a model.

An ONNX file says nothing of the PyTorch code it came from, so torch variants exist only for
models of the zoo. The module is built once per search (the digits factory trains for ~8 s);
the FP32 program is exported once to `model.pt2` and shared by every variant that runs it.
Variants that need the module itself (FP8 and INT8 swap nn.Linear and nn.Conv2d; whole
FP16/BF16 casts of a transformer, whose exported graph has its dtypes baked in) get a
`model.zoo` spec instead, which rebuilds the module at each load. A `+aoti` variant is its
source variant's file compiled ahead of time into `model.aoti.pt2` for the search's device.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlscale.models.repository import ModelVersion
from dlscale.models.zoo import ZOO, ZooModel
from dlscale.models.zoo.inputs import torch_entry
from dlscale.optimize.onnx_variants import RecipeError
from dlscale.optimize.torch_variants import AOTI, EXPORT, MODULE, PT2E_INT8
from dlscale.types import TensorSpec

if TYPE_CHECKING:
    from torch import nn

Arrays = dict[str, np.ndarray]
PT2, ZOO_SPEC = "model.pt2", "model.zoo"


@dataclass(frozen=True)
class TorchSource:
    """A model's PyTorch definition: its zoo entry and the sequence length it was built for."""

    zoo: ZooModel
    seq_len: int

    @property
    def inputs(self) -> list[TensorSpec]:
        """Input specs with the batch dimension, as the torch backend reports them."""
        return [s.with_batch() for s in self.zoo.inputs(self.seq_len)]

    @property
    def outputs(self) -> list[TensorSpec]:
        """Output specs with the batch dimension."""
        return [s.with_batch() for s in self.zoo.outputs(self.seq_len)]


def torch_source(version: ModelVersion) -> tuple[TorchSource | None, str]:
    """The model's PyTorch definition, or None and why there is none.

    The definition is found by the model's name (a renamed zoo model, metadata zoo = true,
    has none). The accuracy guard then proves that the module and the ONNX file agree: a
    same-named model with other weights is rejected, not served.
    """
    metadata = version.config.metadata
    zoo = ZOO.get(version.name)
    if zoo is None:
        flagged = str(metadata.get("zoo", "")).lower() == "true"
        why = (
            "its metadata says zoo = true but no zoo model is called"
            if flagged
            else "no zoo model is called"
        )
        return None, (
            f"PyTorch variants are built from the zoo's PyTorch definition; {why} "
            f"{version.name!r} (the zoo has: {', '.join(ZOO)})"
        )
    return TorchSource(zoo, int(metadata.get("seq_len", 128))), ""


class TorchBuilder:
    """Writes each torch variant's model file; the module and FP32 export are made once."""

    def __init__(
        self,
        source: TorchSource,
        scratch: Path,
        example: Arrays,
        *,
        device: str = "cpu",
        max_batch_size: int = 0,
    ) -> None:
        self.source = source
        self.scratch = scratch
        #: Where and up to which batch `+aoti` packages are compiled for.
        self.device, self.max_batch_size = device, max_batch_size
        #: Two rows keyed by input name, to trace the module with.
        self.example = {s.name: np.ascontiguousarray(example[s.name][:2]) for s in source.inputs}

    def build(
        self,
        recipe: str,
        dest_dir: Path,
        calibration: Arrays | None,
        params: Mapping[str, object] | None = None,
    ) -> Path:
        """The variant's model file in `dest_dir` (model.pt2, model.zoo or model.aoti.pt2)."""
        dest_dir.mkdir(parents=True, exist_ok=True)
        if recipe == AOTI:
            return self._package(dest_dir, dict(params or {}))
        if recipe == EXPORT:
            return Path(shutil.copyfile(self._fp32_program, dest_dir / PT2))
        if recipe == MODULE:
            return torch_entry(self.source.zoo, seq_len=self.source.seq_len).write(
                dest_dir / ZOO_SPEC
            )
        if recipe == PT2E_INT8:
            if calibration is None:
                raise RecipeError("PT2E INT8 needs a calibration set")
            return self._int8_program(dest_dir / PT2, calibration)
        raise RecipeError(f"unknown torch recipe {recipe!r}")

    def _package(self, dest_dir: Path, params: dict[str, object]) -> Path:
        """The source variant's file compiled with AOTInductor (minutes for a large model)."""
        from dlscale.backends import BackendOptions
        from dlscale.backends.torch.aoti import PACKAGE_NAME
        from dlscale.backends.torch.packaging import package_model

        source_recipe = str(params.pop("source", MODULE))
        source = self.build(source_recipe, dest_dir / "source", None)
        options = BackendOptions(
            device=self.device, max_batch_size=self.max_batch_size, extra=params
        )
        try:
            package_model(source, options, dest_dir / PACKAGE_NAME)
        except Exception as exc:  # inductor's own errors: the variant fails with its reason
            raise RecipeError(f"AOTInductor failed: {type(exc).__name__}: {exc}") from exc
        shutil.rmtree(dest_dir / "source")
        return dest_dir / PACKAGE_NAME

    @cached_property
    def _module(self) -> nn.Module:
        return self.source.zoo.torch_module(self.source.seq_len)

    @cached_property
    def _fp32_program(self) -> Path:
        from dlscale.backends.torch.files import save_exported

        path = self.scratch / "fp32" / PT2
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            save_exported(self._module, self.example, self.source.inputs, self.source.outputs, path)
        except Exception as exc:
            raise RecipeError(f"torch.export failed: {type(exc).__name__}: {exc}") from exc
        return path

    def _int8_program(self, path: Path, calibration: Mapping[str, np.ndarray]) -> Path:
        from dlscale.optimize.torch_int8 import quantize_pt2e, save_quantized

        names = [s.name for s in self.source.inputs]
        quantized = quantize_pt2e(self._module, names, self.example, dict(calibration))
        save_quantized(quantized, self.example, self.source.inputs, self.source.outputs, path)
        return path
