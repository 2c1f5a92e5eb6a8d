"""numpy ↔ torch at the backend's boundary: datatypes, and conversions numpy cannot do alone."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import torch

from dlscale.errors import ConfigError
from dlscale.types import Datatype

#: Each datatype's torch dtype, named as its numpy dtype is (bool, uint8, ..., bfloat16, float64).
TORCH_DTYPES: dict[Datatype, torch.dtype] = {
    d: getattr(torch, d.numpy.name) for d in Datatype if d is not Datatype.BYTES
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
    """A CPU tensor sharing the array's memory (BF16 through an int16 view).

    Read-only arrays (views of a received message) are shared too, not copied: a backend only
    reads its inputs. Only a non-contiguous array is copied.
    """
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        array = array.view(np.int16)
        return _shared(array).view(torch.bfloat16)
    return _shared(array)


_quiet = False


def _shared(array: np.ndarray) -> torch.Tensor:
    global _quiet
    if array.flags.writeable or _quiet:
        return torch.from_numpy(array)
    # torch warns once per process that it cannot keep a read-only array read-only; the
    # warning is about a contract the backend keeps (it never writes its inputs).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        tensor = torch.from_numpy(array)
    _quiet = True
    return tensor


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
