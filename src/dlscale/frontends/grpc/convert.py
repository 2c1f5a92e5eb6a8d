"""The DataPlane's typed answers as gRPC messages, and what the servicer reads from requests
beyond their plain fields (parameters, settings).

Inference messages are the wire codec's (`dlscale.wire.grpc`), statistics wire/documents.py's
(shared with REST); this module adds what only the server says: health, metadata, config, the
repository, shared-memory regions, and in-stream errors.
"""

from __future__ import annotations

from typing import Any

from dlscale.serving.regions.registry import RegionKind, RegionStatus
from dlscale.types import (
    ModelConfigView,
    ModelMetadata,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)
from dlscale.wire.documents import config_message
from dlscale.wire.grpc import parameters
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

# -- requests -----------------------------------------------------------------------------------


def load_parameters(message: Any) -> dict[str, Any]:
    """A RepositoryModelLoad request's parameters as plain values (files are bytes)."""
    return parameters(message.parameters, "load parameter")


def trace_changes(message: Any) -> tuple[str, dict[str, Any]]:
    """A TraceSetting request: the model (empty: server-wide) and the settings to change; a
    setting with no value is cleared (None), one value is a string, several a list."""
    changes: dict[str, Any] = {}
    for key, setting in message.settings.items():
        values = list(setting.value)
        changes[key] = None if not values else values if key == "trace_level" else values[0]
    return message.model_name, changes


def trace_settings(settings: dict[str, str | list[str]]) -> Any:
    """TraceSettingResponse."""
    response = pb.TraceSettingResponse()
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response


def log_changes(message: Any) -> dict[str, Any]:
    """A LogSettings request's settings as plain values."""
    out: dict[str, Any] = {}
    for key, value in message.settings.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = None if which is None else getattr(value, which)
    return out


def log_settings(settings: dict[str, str | bool | int]) -> Any:
    """LogSettingsResponse."""
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        slot = response.settings[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            slot.uint32_param = value
        else:
            slot.string_param = value
    return response


# -- inference ----------------------------------------------------------------------------------


def stream_error(text: str, message: Any) -> Any:
    """An in-stream error for a ModelInferRequest; its id ties the error to the request."""
    echo = pb.ModelInferResponse(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    return pb.ModelStreamInferResponse(error_message=text, infer_response=echo)


# -- health, metadata, config -------------------------------------------------------------------


def response(method: str, **fields: Any) -> Any:
    """RPC `method`'s answer of plain `fields`: a health flag, or none (a load, unload,
    register or unregister done)."""
    return getattr(pb, f"{method}Response")(**fields)


def server_metadata(meta: ServerMetadata) -> Any:
    """ServerMetadataResponse."""
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def model_metadata(meta: ModelMetadata) -> Any:
    """ModelMetadataResponse."""
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=[_tensor_metadata(t) for t in meta.inputs],
        outputs=[_tensor_metadata(t) for t in meta.outputs],
    )


def _tensor_metadata(spec: TensorSpec) -> Any:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype.value, shape=spec.shape
    )


def model_config(view: ModelConfigView) -> Any:
    """ModelConfigResponse in Triton's layout."""
    return pb.ModelConfigResponse(config=config_message(view))


# -- repository ---------------------------------------------------------------------------------


def repository_index(rows: list[RepositoryEntry]) -> Any:
    """RepositoryIndexResponse."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=r.name, version=r.version, state=r.state, reason=r.reason
            )
            for r in rows
        ]
    )


# -- shared memory ----------------------------------------------------------------------------


def regions(kind: RegionKind, regions: list[RegionStatus]) -> Any:
    """{System,Cuda}SharedMemoryStatusResponse: the regions of `kind` by name."""
    response = (
        pb.SystemSharedMemoryStatusResponse
        if kind is RegionKind.SYSTEM
        else pb.CudaSharedMemoryStatusResponse
    )
    return response(regions={s.name: response.RegionStatus(**s.fields()) for s in regions})
