"""numpy ↔ torch at the backend's boundary: datatypes, and conversions numpy cannot do alone."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from dlscale.errors import ConfigError
from dlscale.types import Datatype

TORCH_DTYPES: dict[Datatype, torch.dtype] = {
    Datatype.BOOL: torch.bool,
    Datatype.UINT8: torch.uint8,
    Datatype.UINT16: torch.uint16,
    Datatype.UINT32: torch.uint32,
    Datatype.UINT64: torch.uint64,
    Datatype.INT8: torch.int8,
    Datatype.INT16: torch.int16,
    Datatype.INT32: torch.int32,
    Datatype.INT64: torch.int64,
    Datatype.FP16: torch.float16,
    Datatype.BF16: torch.bfloat16,
    Datatype.FP32: torch.float32,
    Datatype.FP64: torch.float64,
}
_DATATYPES = {v: k for k, v in TORCH_DTYPES.items()}


def torch_dtype(datatype: Datatype) -> torch.dtype:
    """The torch dtype holding a protocol datatype; BYTES has none."""
    try:
        return TORCH_DTYPES[datatype]
    except KeyError:
        raise ConfigError(f"the torch backend cannot serve {datatype.value} tensors") from None


def datatype_of(dtype: torch.dtype) -> Datatype:
    """The protocol datatype of a torch dtype."""
    try:
        return _DATATYPES[dtype]
    except KeyError:
        raise ConfigError(f"torch dtype {dtype} has no Open Inference Protocol datatype") from None


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing the array's memory where torch can (BF16 through an int16 view).

    A read-only array (a view of a request body) is copied first: torch would warn that it
    cannot guarantee not to write through it.
    """
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, copy=True, order="C")
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def as_tensor(array: Any) -> torch.Tensor:
    """A tensor over an input: numpy arrays as `from_numpy`, device arrays (CuPy, from a CUDA
    shared-memory region) in place through DLPack."""
    if isinstance(array, np.ndarray):
        return from_numpy(array)
    return torch.utils.dlpack.from_dlpack(array)


def is_on_device(array: Any) -> bool:
    """Whether an input is a device array rather than a host one."""
    return not isinstance(array, np.ndarray) and hasattr(array, "__dlpack__")


def to_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """A numpy view of a CPU tensor (BF16 through an int16 view, as numpy lacks bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
