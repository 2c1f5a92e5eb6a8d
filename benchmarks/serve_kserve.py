"""KServe's Python model server with an identity model, for the benchmarks (KServe's own venv).

    .bench/kserve-venv/bin/python benchmarks/serve_kserve.py MODEL HTTP_PORT GRPC_PORT

`kserve.ModelServer` (uvicorn and FastAPI, the Open Inference Protocol's REST at /v2) with one
`kserve.Model` that answers its input as its output, as numpy: what the ONNX Identity of
benchmarks/harness/models.py computes, without a runtime, so the server's own cost is what is
measured. KServe's model server does not batch. It imports nothing from dlscale (its venv has
none) and serves until killed; readiness is /v2/models/MODEL/ready.
"""

from __future__ import annotations

import sys
from typing import Any

import kserve
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse


class Identity(kserve.Model):  # type: ignore[misc]
    """Answers each input tensor as the output named `output`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    async def predict(self, payload: InferRequest, headers: Any = None, **_: Any) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        out = InferOutput(name="output", shape=list(x.shape), datatype="FP32")
        out.set_data_from_numpy(x, binary_data=False)
        answer_id = payload.id or ""  # a request without an id gets an empty one back
        return InferResponse(response_id=answer_id, model_name=self.name, infer_outputs=[out])


def main() -> None:
    name, http, grpc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    del sys.argv[1:]  # KServe reads its own flags from the command line at import and start
    kserve.ModelServer(http_port=http, grpc_port=grpc, workers=1, enable_grpc=False).start(
        [Identity(name)]
    )


if __name__ == "__main__":
    main()
