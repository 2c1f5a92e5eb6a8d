"""Python models that stream, as users write them: Triton's decoupled model.py and dlscale's
`Model.stream`, and one that follows the generative contract (backends/generative/contract.py)."""

from __future__ import annotations

from pathlib import Path

from tests.toolkit.python_models import write_python_model, write_triton_python_model

from dlscale.wire.generative import signature_toml

#: Triton's decoupled "repeat": one response per element of IN, then the FINAL flag; a negative
#: element makes execute raise after the responses before it were sent.
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        config = json.loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for index, value in enumerate(values):
                if request.is_cancelled():
                    break
                if value < 0:
                    raise ValueError(f"negative value {value} at {index}")
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                idx = pb_utils.Tensor("IDX", np.array([index], np.uint32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

REPEAT_PBTXT = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""

#: dlscale's streaming Model: COUNT ticks (a negative COUNT: until the client leaves).
TICKER = """
import time

import numpy as np


class Model:
    def stream(self, inputs):
        count = int(inputs["COUNT"][0])
        tick = 0
        while count < 0 or tick < count:
            yield {"TICK": np.array([tick], np.int32)}
            tick += 1
            if count < 0:
                time.sleep(0.01)
"""

TICKER_TOML = """
[backend_options]
max_num_seqs = 1
[batching]
priority_levels = 2
[[inputs]]
name = "COUNT"
datatype = "INT32"
shape = [1]
[[outputs]]
name = "TICK"
datatype = "INT32"
shape = [1]
"""

#: A generative model written in Python: each word of the prompt is a token, up to max_tokens.
ECHO = """
import numpy as np


def _text(value):
    return np.array([value.encode()], dtype=object)


class Model:
    def stream(self, inputs, parameters):
        words = inputs["text_input"][0].decode().split()
        most = int(parameters.get("max_tokens", 16))
        said = words[:most]
        for n, word in enumerate(said, 1):
            out = {
                "text_output": _text(word if n == 1 else " " + word),
                "num_input_tokens": np.array([len(words)], np.uint32),
                "num_output_tokens": np.array([n], np.uint32),
            }
            if n == len(said):
                out["finish_reason"] = _text("length" if len(words) > most else "stop")
            yield out
"""

ECHO_TOML = """
""" + signature_toml()

#: A model that answers once (it does not stream).
PLAIN = """
class Model:
    def infer(self, inputs):
        return {"TICK": inputs["COUNT"]}
"""


def streaming_repository(root: Path) -> Path:
    """repeat (Triton, decoupled), ticker (one sequence at a time, two priority levels),
    echo (generative), plain (answers once), and a decoupled model asked to run in a worker
    process (refused at load)."""
    write_triton_python_model(root, "repeat", REPEAT, REPEAT_PBTXT)
    write_python_model(root, "ticker", TICKER, TICKER_TOML)
    write_python_model(root, "echo", ECHO, ECHO_TOML)
    write_python_model(root, "plain", PLAIN, TICKER_TOML.replace("max_num_seqs = 1", ""))
    isolated = TICKER_TOML.replace("max_num_seqs = 1", 'isolation = "process"')
    write_python_model(root, "isolated", TICKER, isolated)
    return root
