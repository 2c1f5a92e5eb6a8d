"""TensorFlow Serving's gRPC services over a Plane: PredictionService (Predict, Classify, Regress,
GetModelMetadata) and ModelService (GetModelStatus); decode, one Plane call, encode.

Imports TensorFlow's protos (through `tensorflow-serving-api`): loaded only when the service is
turned on (`--grpc-tfserving`, tfserving.py). What each call means for any model is
frontends/tfserving's.
"""

from __future__ import annotations

from typing import Any

from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from dlscale.errors import Unsupported
from dlscale.frontends.grpc import tfserving_convert as convert
from dlscale.frontends.grpc.guard import GuardedServer
from dlscale.frontends.grpc.servicer import unary
from dlscale.frontends.plane import Asked
from dlscale.frontends.tfserving import inputs, methods
from dlscale.frontends.tfserving.signature import (
    check_signature,
    statuses,
)
from dlscale.types import InferenceRequest, ModelMetadata, RequestedOutput


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc]
    """tensorflow.serving.PredictionService over a Plane."""

    def __init__(self, plane: Asked, max_elements: int) -> None:
        self.plane = plane
        self.max_elements = max_elements

    @unary
    async def Predict(self, request: Any, context: Any) -> Any:
        meta, version, signature = await self._model(request)
        arrays = convert.predict_inputs(request, meta, self.max_elements)
        wanted = convert.output_filter(request)
        outputs = [RequestedOutput(n) for n in wanted] if wanted else None
        asked = InferenceRequest(meta.name, arrays, version, outputs=outputs)
        response = await self.plane.infer(asked)
        return convert.predict_response(response, signature)

    @unary
    async def Classify(self, request: Any, context: Any) -> Any:
        meta, version, _ = await self._model(request)
        plan = methods.classify_plan(meta)
        response, rows = await self._examples(request, meta, version)
        return convert.classify_response(response, methods.classifications(response, plan, rows))

    @unary
    async def Regress(self, request: Any, context: Any) -> Any:
        meta, version, _ = await self._model(request)
        output = methods.regress_output(meta)
        response, rows = await self._examples(request, meta, version)
        return convert.regress_response(response, methods.regressions(response, output, rows))

    @unary
    async def MultiInference(self, request: Any, context: Any) -> Any:
        raise Unsupported("MultiInference is not served: call Classify or Regress")

    @unary
    async def GetModelMetadata(self, request: Any, context: Any) -> Any:
        name, version, _ = convert.model_spec(request)
        convert.metadata_fields(request)
        meta = await self.plane.model_metadata(name, version)
        return convert.metadata_response(meta, version)

    async def _model(self, request: Any) -> tuple[ModelMetadata, str, str]:
        """The model a request names (its signature checked), the version and the signature."""
        name, version, signature = convert.model_spec(request)
        meta = await self.plane.model_metadata(name, version)
        await check_signature(self.plane, signature, meta, version)
        return meta, version, signature

    async def _examples(self, request: Any, meta: ModelMetadata, version: str) -> Any:
        given, context = convert.examples(request)
        arrays = inputs.from_examples(given, context, meta, self.max_elements)
        response = await self.plane.infer(InferenceRequest(meta.name, arrays, version))
        return response, len(given)


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc]
    """tensorflow.serving.ModelService's GetModelStatus over a Plane (no config reloads)."""

    def __init__(self, plane: Asked) -> None:
        self.plane = plane

    @unary
    async def GetModelStatus(self, request: Any, context: Any) -> Any:
        name, version, _ = convert.model_spec(request)
        rows = await self.plane.repository_index(False)
        return convert.status_response(statuses(name, version, rows))

    @unary
    async def HandleReloadConfigRequest(self, request: Any, context: Any) -> Any:
        raise Unsupported(
            "HandleReloadConfigRequest is not served: load and unload models with the "
            "repository API (docs/serving-grpc.md)"
        )


def add_to(server: GuardedServer, plane: Asked, max_elements: int) -> None:
    """Register both services on `server`."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(plane, max_elements), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(plane), server)
