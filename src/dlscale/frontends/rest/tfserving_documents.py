"""TensorFlow Serving's REST bodies: the request documents read into arrays, and the answers
written in its JSON shapes (predictions / outputs, results, model status, signature_def).

The meaning of each (rows, columns, examples; which outputs classify) is frontends/tfserving's;
here is only the JSON around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from dlscale.errors import InvalidInput
from dlscale.frontends.rest.documents import json_object
from dlscale.frontends.tfserving import inputs
from dlscale.frontends.tfserving.methods import Classes
from dlscale.frontends.tfserving.signature import (
    DTYPES,
    PREDICT_METHOD,
    SERVING_DEFAULT,
    VersionStatus,
)
from dlscale.frontends.tfserving.values import to_value
from dlscale.types import InferenceResponse, ModelMetadata, TensorSpec
from dlscale.wire.tensors import Buffer

_PREDICT_KEYS = ("signature_name", "instances", "inputs")
_EXAMPLE_KEYS = ("signature_name", "context", "examples")


@dataclass
class Decoded:
    """A request's arrays, its signature and, for the row format and examples, its row count."""

    arrays: inputs.Arrays
    signature: str
    rows: int | None


def read_document(body: Buffer, verb: str) -> dict[str, Any]:
    """The request's JSON object, with only the keys its verb takes."""
    doc = json_object(body, verb)
    allowed = _PREDICT_KEYS if verb == "predict" else _EXAMPLE_KEYS
    unknown = [k for k in doc if k not in allowed]
    if unknown:
        raise InvalidInput(
            f"the {verb} request has unknown field {unknown[0][:100]!r}; its fields: "
            f"{', '.join(allowed)}"
        )
    signature = doc.get("signature_name", "")
    if not isinstance(signature, str):
        raise InvalidInput("'signature_name' must be a string")
    return doc


def predict_arrays(doc: dict[str, Any], meta: ModelMetadata, most: int) -> Decoded:
    """A predict request's arrays: from `instances` (rows) or `inputs` (columns), never both."""
    has_rows, has_columns = "instances" in doc, "inputs" in doc
    if has_rows == has_columns:
        raise InvalidInput(
            "the predict request must have exactly one of 'instances' (the row format) and "
            "'inputs' (the columnar format)" + (", not both" if has_rows else "")
        )
    signature = doc.get("signature_name", "")
    if has_rows:
        arrays = inputs.from_rows(doc["instances"], meta, most)
        return Decoded(arrays, signature, len(doc["instances"]))
    return Decoded(inputs.from_columns(doc["inputs"], meta, most), signature, None)


def example_arrays(doc: dict[str, Any], meta: ModelMetadata, most: int) -> Decoded:
    """A classify or regress request's arrays: one row per example, the context in each."""
    examples, context = doc.get("examples"), doc.get("context", {})
    if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
        raise InvalidInput("'examples' must be a list of objects, feature name to value")
    if not isinstance(context, dict):
        raise InvalidInput("'context' must be an object, feature name to value")
    arrays = inputs.from_examples(examples, context, meta, most)
    return Decoded(arrays, doc.get("signature_name", ""), len(examples))


def predict_answer(response: InferenceResponse, rows: int | None) -> bytes:
    """`{"predictions": ...}` for the row format, `{"outputs": ...}` for the columnar one."""
    values = {name: to_value(array, name) for name, array in response.outputs.items()}
    if rows is None:
        only = len(values) == 1
        return _dumps({"outputs": next(iter(values.values())) if only else values})
    for name, array in response.outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise InvalidInput(
                f"output {name!r} has shape {list(array.shape)}, not one row for each of the "
                f"{rows} instances: ask with the columnar format ('inputs') instead"
            )
    if len(values) == 1:
        return _dumps({"predictions": next(iter(values.values()))})
    return _dumps({"predictions": [{n: v[i] for n, v in values.items()} for i in range(rows)]})


def classify_answer(results: list[Classes]) -> bytes:
    """`{"result": [[[label, score], ...], ...]}`, one list of classes per example."""
    return _dumps({"result": [[[label, score] for label, score in row] for row in results]})


def regress_answer(results: list[float]) -> bytes:
    """`{"result": [value, ...]}`, one value per example."""
    return _dumps({"result": results})


def status_document(rows: list[VersionStatus]) -> dict[str, Any]:
    """GetModelStatus's JSON: `{"model_version_status": [{version, state, status}]}`."""
    return {
        "model_version_status": [
            {
                "version": str(r.version),
                "state": r.state,
                "status": {"error_code": r.error_code, "error_message": r.error_message},
            }
            for r in rows
        ]
    }


def metadata_document(meta: ModelMetadata, version: str) -> dict[str, Any]:
    """GetModelMetadata's JSON: the model spec and its one signature, `serving_default`."""
    signature = {
        "inputs": _tensors(meta.inputs),
        "outputs": _tensors(meta.outputs),
        "method_name": PREDICT_METHOD,
    }
    shown = version or (meta.versions[-1] if meta.versions else "")
    return {
        "model_spec": {"name": meta.name, "signature_name": "", "version": shown},
        "metadata": {"signature_def": {"signature_def": {SERVING_DEFAULT: signature}}},
    }


def _tensors(specs: tuple[TensorSpec, ...]) -> Mapping[str, Any]:
    return {
        s.name: {
            "dtype": DTYPES[s.datatype],
            "tensor_shape": {
                "dim": [{"size": str(d), "name": ""} for d in s.shape],
                "unknown_rank": False,
            },
            "name": s.name,
        }
        for s in specs
    }


def _dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
