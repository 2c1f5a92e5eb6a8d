"""Datatypes map both ways to numpy; every error maps to one HTTP status and one gRPC code."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest

from dlscale import errors
from dlscale.types import Datatype, TensorSpec


@pytest.mark.parametrize("datatype", [d for d in Datatype if d is not Datatype.BYTES])
def test_datatype_round_trips_through_numpy(datatype: Datatype) -> None:
    assert Datatype.from_numpy(datatype.numpy) is datatype
    assert datatype.itemsize == datatype.numpy.itemsize


def test_sizes_and_special_types() -> None:
    assert Datatype.BF16.numpy == np.dtype(ml_dtypes.bfloat16)
    assert Datatype.BF16.itemsize == 2 and Datatype.BOOL.itemsize == 1
    assert Datatype.from_numpy(np.dtype(object)) is Datatype.BYTES
    assert Datatype.from_numpy(np.dtype("S5")) is Datatype.BYTES
    assert not Datatype.FP16.json_safe and not Datatype.BF16.json_safe
    assert Datatype.FP32.json_safe
    with pytest.raises(ValueError, match="complex64"):
        Datatype.from_numpy(np.complex64)


def test_tensor_spec_matching() -> None:
    spec = TensorSpec("input", Datatype.FP32, (-1, 16))
    assert spec.matches((3, 16)) and not spec.matches((3, 15)) and not spec.matches((16,))
    assert spec.to_dict() == {"name": "input", "datatype": "FP32", "shape": [-1, 16]}
    assert TensorSpec("x", Datatype.INT64, (128,)).with_batch().shape == (-1, 128)


def _error_classes() -> list[type[errors.DlscaleError]]:
    found, todo = [], [errors.DlscaleError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


#: The codes gRPC has for a failure (every one but OK): the servicer aborts with
#: grpc.StatusCode[error.grpc_code].
GRPC_CODES = set(grpc.StatusCode.__members__) - {"OK"}


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_maps_to_a_status_and_code(cls: type[errors.DlscaleError]) -> None:
    assert 400 <= cls.http_status < 600
    assert cls.grpc_code in GRPC_CODES
    assert cls.reason in {"REJECTED", "CANCELED", "BACKEND", "OTHER"}


def test_specific_mappings() -> None:
    assert errors.NotFound.http_status == 404 and errors.NotFound.grpc_code == "NOT_FOUND"
    assert errors.InvalidInput.http_status == 400
    assert (
        errors.QueueFull.http_status == 503 and errors.QueueFull.grpc_code == "RESOURCE_EXHAUSTED"
    )
    assert errors.PayloadTooLarge.http_status == 413
    too_many = errors.TooManyRequests
    assert too_many.http_status == 429 and too_many.grpc_code == "RESOURCE_EXHAUSTED"
    assert errors.BackendError.reason == "BACKEND"
    unauthenticated = errors.Unauthenticated
    assert unauthenticated.http_status == 401 and unauthenticated.grpc_code == "UNAUTHENTICATED"


def test_config_type_names_follow_triton() -> None:
    assert Datatype.FP32.config_type == "TYPE_FP32"
    assert Datatype.BF16.config_type == "TYPE_BF16"
    assert Datatype.BYTES.config_type == "TYPE_STRING"
