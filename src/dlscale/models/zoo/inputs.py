"""The input datatypes a zoo model can be served with on the torch backend, and their files.

A zoo model is built with FP32 inputs. Served on a GPU, its inputs can be declared FP16 (half
the bytes over PCIe; the backend casts nothing, the model computes in FP16 anyway) or, for the
image models, UINT8 pixels (a quarter of the bytes): the model then normalizes on the device,
`(pixels / scale - mean) / std` per channel, the same arithmetic that made its FP32 inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dlscale.models.zoo.images import IMAGENET_MEAN, IMAGENET_STD
from dlscale.models.zoo.model import WEIGHT_SEED, Arrays, ZooModel
from dlscale.types import Datatype, TensorSpec

InputType = Literal["fp32", "fp16", "uint8"]
#: The factory that wraps a zoo model behind its pixel normalization.
PIXEL_FACTORY = "dlscale.models.zoo.nets.pixels:make"


@dataclass(frozen=True)
class PixelScale:
    """How a model's FP32 image input is made from UINT8 pixels, per channel."""

    #: The pixel value of full intensity (255; digits: 16).
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def _broadcast(self) -> tuple[np.ndarray, np.ndarray]:
        shape = (1, len(self.mean), 1, 1)
        mean = np.asarray(self.mean, np.float32).reshape(shape)
        return mean, np.asarray(self.std, np.float32).reshape(shape)

    def to_images(self, pixels: np.ndarray) -> np.ndarray:
        """FP32 normalized images from UINT8 pixels (what the model computes on the device)."""
        mean, std = self._broadcast()
        images: np.ndarray = (pixels.astype(np.float32) / self.scale - mean) / std
        return images

    def to_pixels(self, images: np.ndarray) -> np.ndarray:
        """UINT8 pixels of normalized FP32 images, rounded to the nearest level."""
        mean, std = self._broadcast()
        levels = np.rint((images * std + mean) * self.scale)
        pixels: np.ndarray = np.clip(levels, 0, min(self.scale, 255)).astype(np.uint8)
        return pixels


#: The zoo's image models and their pixels: ImageNet's normalization, digits' 0-16 levels.
PIXELS: dict[str, PixelScale] = {
    "resnet50": PixelScale(
        255.0, tuple(IMAGENET_MEAN.ravel().tolist()), tuple(IMAGENET_STD.ravel().tolist())
    ),
    "digits": PixelScale(16.0, (0.0,), (1.0,)),
}


@dataclass(frozen=True)
class TorchEntry:
    """What a model.zoo file holds: the factory, its arguments and the declared tensors."""

    factory: str
    kwargs: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def write(self, path: Path) -> Path:
        """Write the model.zoo file (the torch backend builds the module from it at load)."""
        from dlscale.backends.torch.files import write_module_spec

        path.parent.mkdir(parents=True, exist_ok=True)
        write_module_spec(path, self.factory, self.kwargs, self.inputs, self.outputs)
        return path


def torch_entry(model: ZooModel, input_type: InputType = "fp32", seq_len: int = 128) -> TorchEntry:
    """The model.zoo contents that serve `model` with inputs of `input_type`."""
    inputs = [s.with_batch() for s in model.inputs(seq_len)]
    outputs = [s.with_batch() for s in model.outputs(seq_len)]
    kwargs: dict[str, Any] = {"seed": WEIGHT_SEED}
    factory = model.factory
    if input_type == "uint8":
        if model.name not in PIXELS:
            raise ValueError(f"{model.name} takes no images: UINT8 inputs are for {sorted(PIXELS)}")
        factory, kwargs = PIXEL_FACTORY, {"model": model.name, "seed": WEIGHT_SEED}
    declared = {"fp16": Datatype.FP16, "uint8": Datatype.UINT8}.get(input_type)
    if declared is not None:
        inputs = [
            TensorSpec(s.name, declared, s.shape) if s.datatype is Datatype.FP32 else s
            for s in inputs
        ]
    return TorchEntry(factory, kwargs, inputs, outputs)


def as_input_type(model: ZooModel, arrays: Mapping[str, np.ndarray], input_type: str) -> Arrays:
    """FP32 samples of `model` as its inputs of `input_type` (integer inputs unchanged)."""
    out: Arrays = {}
    for name, array in arrays.items():
        if array.dtype != np.float32 or input_type == "fp32":
            out[name] = array
        elif input_type == "fp16":
            out[name] = array.astype(np.float16)
        else:
            out[name] = PIXELS[model.name].to_pixels(array)
    return out
