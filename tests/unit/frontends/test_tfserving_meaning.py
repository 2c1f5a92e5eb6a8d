"""What TensorFlow Serving's requests mean for any model (frontends/tfserving/): statuses from
the repository index, values checked against the element bound before an array is made, which
outputs classify and regress."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.errors import InvalidInput, NotFound
from dlscale.frontends.tfserving import inputs, methods
from dlscale.frontends.tfserving.signature import VersionStatus, statuses
from dlscale.frontends.tfserving.values import to_array
from dlscale.types import Datatype, ModelMetadata, RepositoryEntry, TensorSpec

F32 = Datatype.FP32


def _meta(*outputs: TensorSpec) -> ModelMetadata:
    return ModelMetadata("m", ("1",), "onnx", (TensorSpec("x", F32, (-1, 3)),), outputs)


def test_statuses_map_each_repository_state() -> None:
    rows = [
        RepositoryEntry("m", "READY", "", "2"),
        RepositoryEntry("m", "LOADING", "", "3"),
        RepositoryEntry("m", "UNAVAILABLE", "bad file", "1"),
        RepositoryEntry("other", "READY", "", "1"),
    ]
    assert statuses("m", "", rows) == [
        VersionStatus(1, "END", "UNKNOWN", "bad file"),
        VersionStatus(2, "AVAILABLE", "OK", ""),
        VersionStatus(3, "LOADING", "OK", ""),
    ]
    assert statuses("m", "3", rows) == [VersionStatus(3, "LOADING", "OK", "")]
    with pytest.raises(NotFound, match="version 9"):
        statuses("m", "9", rows)


def test_a_value_over_the_element_bound_is_refused_before_its_array() -> None:
    spec = TensorSpec("x", F32, (-1, 3))
    with pytest.raises(InvalidInput, match="max_tensor_elements"):
        to_array([[1.0, 2.0, 3.0]] * 4, spec, 11)
    assert to_array([[1.0, 2.0, 3.0]] * 4, spec, 12).dtype == np.float32


def test_examples_take_lone_values_and_reshape_to_the_row() -> None:
    meta = ModelMetadata("m", ("1",), "", (TensorSpec("x", F32, (-1, 1, 2)),), ())
    arrays = inputs.from_examples([{"x": [1.0, 2.0]}, {"x": [3.0, 4.0]}], {}, meta, 100)
    assert arrays["x"].shape == (2, 1, 2)
    single = ModelMetadata("m", ("1",), "", (TensorSpec("x", F32, (-1, 1)),), ())
    assert inputs.from_examples([{"x": 5.0}], {}, single, 100)["x"].tolist() == [[5.0]]


def test_which_outputs_classify_and_regress() -> None:
    assert methods.classify_plan(_meta(TensorSpec("p", F32, (-1, 4)))).scores == "p"
    labeled = _meta(
        TensorSpec("scores", F32, (-1, 4)), TensorSpec("classes", Datatype.BYTES, (-1, 4))
    )
    assert methods.classify_plan(labeled) == methods.ClassifyPlan("scores", "classes")
    with pytest.raises(InvalidInput, match="cannot classify"):
        methods.classify_plan(_meta(TensorSpec("p", Datatype.INT64, (-1, 4))))
    assert methods.regress_output(_meta(TensorSpec("v", F32, (-1,)))) == "v"
    assert (
        methods.regress_output(
            _meta(TensorSpec("a", F32, (-1, 2)), TensorSpec("outputs", F32, (-1, 1)))
        )
        == "outputs"
    )
    with pytest.raises(InvalidInput, match="cannot regress"):
        methods.regress_output(_meta(TensorSpec("v", F32, (-1, 2))))
