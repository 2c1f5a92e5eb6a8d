"""Python models for the tests: dlscale's `Model` API and Triton's, as users write them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

#: A Triton user's model.py (Triton's add_sub example, and a refusal of NaN inputs that fails
#: only the request that sent them).
ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.output_dtype = pb_utils.triton_string_to_numpy(config["data_type"])
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if np.isnan(in_0).any():
                error = pb_utils.TritonError("INPUT0 holds NaN", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output_dtype))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"{self.name}: finalize")
"""

#: Triton's BLS: execute calls add_sub on the same server and doubles its OUTPUT0.
BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", total * 2)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

#: A model whose execute raises on negative input, and sleeps when asked (to be killed in the
#: middle of a batch; a file `sleeping` in its folder says it began); OUTPUT1 tells its pid.
FRAGILE = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                raise ValueError("negative input is not allowed")
            if (x > 1000).any():
                open(os.path.join(self.folder, "sleeping"), "w").close()
                time.sleep(float(x.max()) / 1000)
            pid = np.full((x.shape[0], 1), os.getpid(), np.int64)
            outputs = [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", pid)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

TRITON_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}{more}
]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{parameters}
"""

FRAGILE_CONFIG = """
name: "fragile"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""

#: dlscale's own API: a class `Model`, loaded once, batched infer on named arrays.
SCALE = """
import numpy as np


class Model:
    def load(self, context):
        self.factor = float(context.parameters.get("factor", 1.0))
        self.output = context.outputs[0].name

    def infer(self, inputs):
        x = inputs["x"]
        if np.isinf(x).any():
            raise RuntimeError("infinite input")
        return {self.output: x * self.factor}
"""

SCALE_CONFIG = """
max_batch_size = 8
[batching]
max_queue_delay_us = 20000
[backend_options]
factor = 3.0
isolation = "{isolation}"
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [4]
"""


#: The config.pbtxt of a Triton Python model that is loaded and never asked (one FP32 in, one out).
LOADED_ONLY_PBTXT = """backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def write_python_model(root: Path, name: str, code: str, config: str) -> Path:
    """REPO/<name>/1/model.py and a config.toml with `backend = "python"` prepended."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(code)
    (folder / "config.toml").write_text('backend = "python"\n' + config)
    return folder


def write_triton_python_model(root: Path, name: str, code: str, pbtxt: str) -> Path:
    """REPO/<name>/1/model.py and REPO/<name>/config.pbtxt, as a Triton user lays them out."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(code)
    (folder / "config.pbtxt").write_text(pbtxt)
    return folder


#: Fails each request with the TritonError code its INPUT0[0, 0] holds.
CODED_ERRORS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            code = int(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0, 0])
            out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("coded", code)))
        return out
"""


#: Triton's `is_ready` for add_sub (readiness_model): told what to answer by the file `readiness`
#: in the model's folder: "yes", "no", "raise", "maybe" (not a bool) or "hang" (until a file
#: `release` is there, then yes); each call is counted as a line of the file `asked` there.
IS_READY = """

    DEF is_ready(self):
        import time
        from pathlib import Path

        folder = Path(__file__).resolve().parents[1]
        with open(folder / "asked", "a") as asked:
            asked.write("asked\\n")
        said = (folder / "readiness").read_text().strip()
        if said == "raise":
            raise RuntimeError("the feature store is unreachable")
        while said == "hang" and not (folder / "release").exists():
            time.sleep(0.05)
        return {"yes": True, "no": False, "maybe": "maybe", "hang": True}[said]
"""


def readiness_model(asynchronous: bool) -> str:
    """add_sub with IS_READY, as `def` or `async def` (Triton takes both)."""
    return ADD_SUB.rstrip() + "\n" + IS_READY.replace("DEF", "async def" if asynchronous else "def")


def triton_config(name: str, outputs: Sequence[str] = ("OUTPUT1",), isolation: str = "") -> str:
    """add_sub's config.pbtxt for `name`: two FP32 inputs of 4, OUTPUT0 and `outputs` alike."""
    more = "".join(f',\n  {{ name: "{o}" data_type: TYPE_FP32 dims: [ 4 ] }}' for o in outputs)
    parameters = (
        f'parameters {{ key: "DLSCALE_ISOLATION" value: {{ string_value: "{isolation}" }} }}'
        if isolation
        else ""
    )
    return TRITON_CONFIG.format(name=name, more=more, parameters=parameters)


def python_repository(root: Path) -> Path:
    """A Triton-style repository of Python models: add_sub (a worker process, as Triton runs
    it), add_sub_inline (the same code in the server process), bls and a_bls (call add_sub),
    fragile (raises, sleeps, tells its pid), coded (fails with the code it is sent), and
    dlscale's API in process (scale) and in a worker (scale_worker)."""
    write_triton_python_model(root, "add_sub", ADD_SUB, triton_config("add_sub"))
    inline = triton_config("add_sub_inline", isolation="thread")
    write_triton_python_model(root, "add_sub_inline", ADD_SUB, inline)
    write_triton_python_model(root, "bls", BLS, triton_config("bls", outputs=()))
    # Loads before the model it calls (names load in order): it must not be warmed up.
    write_triton_python_model(root, "a_bls", BLS, triton_config("a_bls", outputs=()))
    write_triton_python_model(root, "fragile", FRAGILE, FRAGILE_CONFIG)
    coded = triton_config("coded", isolation="thread")
    write_triton_python_model(root, "coded", CODED_ERRORS, coded)
    write_python_model(root, "scale", SCALE, SCALE_CONFIG.format(isolation="thread"))
    write_python_model(root, "scale_worker", SCALE, SCALE_CONFIG.format(isolation="process"))
    return root
