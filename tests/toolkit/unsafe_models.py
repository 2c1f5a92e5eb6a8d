"""Python models that misbehave as user code can: wrong outputs, leaks, hangs (issue 33)."""

from __future__ import annotations

from pathlib import Path

from tests.toolkit.python_models import (
    FRAGILE,
    FRAGILE_CONFIG,
    write_python_model,
    write_triton_python_model,
)

#: Returns OUTPUT0 = 2 * INPUT0, or, when INPUT0[0, 0] asks for it, an output its config does
#: not allow: 1 a [2, 3] shape, 2 seven rows, 3 BYTES, 4 NaN values (legal), 5 one more,
#: undeclared output, 6 32 MB.
WRONG = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            mode = int(x[0, 0])
            y = x * 2
            extra = []
            if mode == 1:
                y = np.zeros((2, 3), np.float32)
            elif mode == 2:
                y = np.zeros((7, 4), np.float32)
            elif mode == 3:
                y = np.array([[b"a"] * 4] * x.shape[0], dtype=object)
            elif mode == 4:
                y = np.full(x.shape, np.nan, np.float32)
            elif mode == 5:
                extra = [pb_utils.Tensor("SECRET", x)]
            elif mode == 6:
                y = np.zeros((x.shape[0], 2 * 2**20), np.float32)
            out = [pb_utils.Tensor("OUTPUT0", y), *extra]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
"""

WRONG_CONFIG = """
name: "wrong"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

#: Keeps 64 MB more at each call (touched, so resident); y = x and its worker's pid.
LEAKY = """
import os

import numpy as np


class Model:
    def load(self, context):
        self.hoard = []

    def infer(self, inputs):
        self.hoard.append(np.ones(8 * 2**20))
        x = inputs["x"]
        return {"y": x, "pid": np.full((x.shape[0], 1), os.getpid(), np.int64)}
"""

LEAKY_CONFIG = """
max_batch_size = 8
[backend_options]
isolation = "process"
max_worker_memory_mb = 300
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "pid"
datatype = "INT64"
shape = [1]
"""


def unsafe_repository(root: Path) -> Path:
    """wrong (returns what its config forbids when asked), leaky (its worker grows at each
    call) and fragile (raises for a whole batch on negative input; sleeps when asked: 1e12 is
    for ever), each in a worker process; fragile batches what arrives within 0.5 s."""
    write_triton_python_model(root, "wrong", WRONG, WRONG_CONFIG)
    write_python_model(root, "leaky", LEAKY, LEAKY_CONFIG)
    slow_batching = FRAGILE_CONFIG.replace(
        "max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 500000"
    )
    assert slow_batching != FRAGILE_CONFIG, "FRAGILE_CONFIG's batching changed"
    write_triton_python_model(root, "fragile", FRAGILE, slow_batching)
    return root
