"""Small helpers around the real clients the tests drive the server with."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as triton


def infer_input(name: str, array: np.ndarray) -> triton.InferInput:
    """A tritonclient gRPC input holding `array` (raw contents, as tritonclient sends them)."""
    datatype = "BYTES" if array.dtype == object else triton.np_to_triton_dtype(array.dtype)
    inp = triton.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp
