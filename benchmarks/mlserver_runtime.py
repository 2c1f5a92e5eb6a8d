"""An MLServer runtime that runs an ONNX file with onnxruntime (loaded inside MLServer's venv).

It imports nothing from dlscale: MLServer runs in its own environment (see peers.py).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    """One onnxruntime session; inputs and outputs by name, as numpy arrays."""

    async def load(self) -> bool:
        path = await get_model_uri(self._settings)
        options = ort.SessionOptions()
        extra = self._settings.parameters.extra if self._settings.parameters else {}
        options.intra_op_num_threads = int((extra or {}).get("intra_op_threads", 1))
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {i.name: NumpyCodec.decode_input(i).astype(np.float32) for i in payload.inputs}
        results = self._session.run(self._outputs, feed)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output(name, array)
                for name, array in zip(self._outputs, results, strict=True)
            ],
        )
