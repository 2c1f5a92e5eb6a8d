"""A model's TensorFlow Serving signature and status, from dlscale's metadata and index.

Every model has one signature, `serving_default`, whose inputs and outputs are the model's own
(their names are the keys; the batch dimension is -1). TensorFlow's dtypes are named as its
`types.proto` names them, so that REST writes the names and gRPC the enum of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidInput, NotFound
from dlscale.frontends.plane import Asked
from dlscale.types import Datatype, ModelMetadata, RepositoryEntry

SERVING_DEFAULT = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
#: A config parameter naming another signature the model answers to (a TensorFlow model's own).
SIGNATURE_PARAMETER = "signature_name"

#: TensorFlow's name of each datatype (tensorflow/core/framework/types.proto).
DTYPES: dict[Datatype, str] = {
    Datatype.BOOL: "DT_BOOL",
    Datatype.UINT8: "DT_UINT8",
    Datatype.UINT16: "DT_UINT16",
    Datatype.UINT32: "DT_UINT32",
    Datatype.UINT64: "DT_UINT64",
    Datatype.INT8: "DT_INT8",
    Datatype.INT16: "DT_INT16",
    Datatype.INT32: "DT_INT32",
    Datatype.INT64: "DT_INT64",
    Datatype.FP16: "DT_HALF",
    Datatype.BF16: "DT_BFLOAT16",
    Datatype.FP32: "DT_FLOAT",
    Datatype.FP64: "DT_DOUBLE",
    Datatype.BYTES: "DT_STRING",
}
DATATYPES: dict[str, Datatype] = {v: k for k, v in DTYPES.items()}

#: dlscale's repository states as TensorFlow Serving's ModelVersionStatus.State names them.
STATES = {
    "READY": "AVAILABLE",
    "LOADING": "LOADING",
    "UNLOADING": "UNLOADING",
    "UNAVAILABLE": "END",
}


async def check_signature(plane: Asked, name: str, meta: ModelMetadata, version: str) -> None:
    """InvalidInput unless `name` is empty, `serving_default` or the other name the model's
    config gives (SIGNATURE_PARAMETER, a TensorFlow model's own)."""
    if name in ("", SERVING_DEFAULT):
        return
    config = await plane.model_config(meta.name, version)
    other = config.parameters.get(SIGNATURE_PARAMETER, "")
    if other and name == other:
        return
    known = ", ".join(repr(n) for n in (SERVING_DEFAULT, other) if n)
    raise InvalidInput(
        f"model {meta.name!r} has no signature {name[:200]!r}; its signatures: {known}"
    )


@dataclass(frozen=True)
class VersionStatus:
    """One served version's state, as ModelVersionStatus carries it."""

    version: int
    state: str
    error_code: str
    error_message: str


def version_number(text: str) -> int:
    """A version as TensorFlow Serving's int64; a version that is not a number is 0."""
    return int(text) if text.isdigit() and len(text) < 19 else 0


def statuses(name: str, version: str, rows: list[RepositoryEntry]) -> list[VersionStatus]:
    """The model's versions (one, when `version` is given) with their states; NotFound if none."""
    found = [r for r in rows if r.name == name and (not version or r.version == version)]
    if not found:
        which = f"version {version} of model" if version else "any version of model"
        raise NotFound(f"Could not find {which} {name!r}")
    out = []
    for row in found:
        state = STATES.get(row.state, "UNKNOWN")
        failed = row.state == "UNAVAILABLE" and bool(row.reason)
        code, message = ("UNKNOWN", row.reason) if failed else ("OK", "")
        out.append(VersionStatus(version_number(row.version), state, code, message))
    return sorted(out, key=lambda s: s.version)
