"""TensorFlow Serving's gRPC API (--grpc-tfserving) with its own client: PredictionServiceStub and
ModelServiceStub from `tensorflow-serving-api`, TensorProtos made by tf.make_tensor_proto, over
grpc to a real server. The same request answers as the Open Inference Protocol's ModelInfer does;
each malformed request gets its status code and reason, and the server keeps serving.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.integration.tfserving.conftest import HAS_STUBS
from tests.toolkit.clients import infer_input
from tests.toolkit.lazy import lazy
from tests.toolkit.server import LocalServer
from tests.toolkit.tfserving import ADDEND

if not HAS_STUBS:
    pytest.skip(
        "tensorflow-serving-api is not installed: TensorFlow Serving's gRPC API is not served",
        allow_module_level=True,
    )

# Imported when a test first uses them: TensorFlow's import takes 5 s in each pytest worker.
tf = lazy("tensorflow")
classification_pb2 = lazy("tensorflow_serving.apis.classification_pb2")
get_model_metadata_pb2 = lazy("tensorflow_serving.apis.get_model_metadata_pb2")
get_model_status_pb2 = lazy("tensorflow_serving.apis.get_model_status_pb2")
model_service_pb2_grpc = lazy("tensorflow_serving.apis.model_service_pb2_grpc")
predict_pb2 = lazy("tensorflow_serving.apis.predict_pb2")
prediction_service_pb2_grpc = lazy("tensorflow_serving.apis.prediction_service_pb2_grpc")
regression_pb2 = lazy("tensorflow_serving.apis.regression_pb2")

ROWS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]], np.float32)


@pytest.fixture(scope="module")
def channel(server: LocalServer) -> Iterator[grpc.Channel]:
    assert server.grpc.tfserving_served
    with grpc.insecure_channel(server.grpc_url) as c:
        yield c


@pytest.fixture
def stub(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _predict(model: str, version: int | None = None, **arrays: Any) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    for name, array in arrays.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return request


def _example(**features: Any) -> tf.train.Example:
    def feature(values: Any) -> tf.train.Feature:
        if isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    return tf.train.Example(
        features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
    )


def test_predict_answers_as_model_infer(
    stub: prediction_service_pb2_grpc.PredictionServiceStub, server: LocalServer
) -> None:
    with tg.InferenceServerClient(server.grpc_url) as triton:
        want = triton.infer("add", [infer_input("input", ROWS)]).as_numpy("output")
    answer = stub.Predict(_predict("add", input=ROWS), timeout=30)
    np.testing.assert_array_equal(tf.make_ndarray(answer.outputs["output"]), want)
    np.testing.assert_array_equal(want, ROWS + ADDEND)
    assert answer.model_spec.name == "add" and answer.model_spec.version.value == 1
    assert answer.model_spec.signature_name == "serving_default"


def test_predict_filters_outputs_and_keeps_types(
    stub: prediction_service_pb2_grpc.PredictionServiceStub,
) -> None:
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.int32).reshape(2, 4)
    request = _predict("mixed", 1, a=a, b=b)
    request.output_filter.append("b_copy")
    answer = stub.Predict(request, timeout=30)
    assert list(answer.outputs) == ["b_copy"]
    copy = tf.make_ndarray(answer.outputs["b_copy"])
    assert copy.dtype == np.int32 and np.array_equal(copy, b)
    scalar = stub.Predict(_predict("one", input=np.float32(2.0).reshape(1, 1)), timeout=30)
    assert tf.make_ndarray(scalar.outputs["output"]).tolist() == [[2.5]]


def test_strings_travel_as_bytes(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    text = np.array([[b"caf\xc3\xa9", b"\x00\xff"]], dtype=object)
    blob = np.array([[b"\x01\x02"]], dtype=object)
    answer = stub.Predict(_predict("words", text=text, blob=blob), timeout=30)
    assert tf.make_ndarray(answer.outputs["text_out"]).tolist() == text.tolist()
    assert tf.make_ndarray(answer.outputs["blob_bytes"]).tolist() == blob.tolist()


def test_typed_fields_and_half_floats(
    stub: prediction_service_pb2_grpc.PredictionServiceStub,
) -> None:
    half = np.array([[1.5, -2.25]], np.float16)
    request = _predict("half", x=half)
    given = request.inputs["x"]
    given.ClearField("tensor_content")
    given.half_val.extend(half.view(np.uint16).ravel().tolist())  # bit patterns, as TF's protos
    answer = tf.make_ndarray(stub.Predict(request, timeout=30).outputs["y"])
    assert answer.dtype == np.float16 and np.array_equal(answer, half)
    filled = _predict("add", input=ROWS)
    filled.inputs["input"].ClearField("tensor_content")
    filled.inputs["input"].float_val.append(0.5)  # one value fills the shape
    got = tf.make_ndarray(stub.Predict(filled, timeout=30).outputs["output"])
    assert np.array_equal(got, np.full(ROWS.shape, 0.5 + ADDEND, np.float32))


def test_the_docs_python_example_runs(
    server: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "tfserving.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(example.replace("127.0.0.1:8001", server.grpc_url), {})
    assert capsys.readouterr().out == f"{np.ones((2, 16), np.float32)}\n"


def test_classify_and_regress(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "labeled"
    given = request.input.example_list_with_context
    given.context.CopyFrom(_example(names=[b"cat", b"dog", b"eel"]))
    given.examples.append(_example(x=[0.25, 0.5, 0.125]))
    result = stub.Classify(request, timeout=30).result.classifications
    assert [(c.label, c.score) for c in result[0].classes] == [
        ("cat", 0.25),
        ("dog", 0.5),
        ("eel", 0.125),
    ]
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "one"
    regress.input.example_list.examples.extend([_example(input=[2.0]), _example(input=[3.0])])
    values = stub.Regress(regress, timeout=30).result.regressions
    assert [r.value for r in values] == [2.5, 3.5]


def test_status_and_metadata(
    stub: prediction_service_pb2_grpc.PredictionServiceStub, channel: grpc.Channel
) -> None:
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "add"
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    (version,) = models.GetModelStatus(status, timeout=30).model_version_status
    assert (
        version.version == 1 and version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    )
    assert version.status.error_code == 0
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "sumdiff"
    answer = stub.GetModelMetadata(request, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    answer.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    assert signature.inputs["a"].dtype == tf.float32.as_datatype_enum
    assert [d.size for d in signature.inputs["a"].tensor_shape.dim] == [-1, 4]
    assert sorted(signature.outputs) == ["diff", "sum"]


def _bad_content() -> Any:
    request = _predict("add", input=ROWS)
    request.inputs["input"].tensor_content = b"\x00" * 5
    return request


def _filtered(output: str) -> Any:
    request = _predict("add", input=ROWS)
    request.output_filter.append(output)
    return request


def _typed(field: str, count: int) -> Any:
    request = _predict("half", input=np.zeros((1, 2), np.float16))
    request.inputs.clear()
    x = request.inputs["x"]
    x.dtype = tf.float16.as_datatype_enum
    x.tensor_shape.dim.add(size=1)
    x.tensor_shape.dim.add(size=2)
    getattr(x, field).extend([0] * count)
    return request


def _label() -> Any:
    request = _predict("add", input=ROWS)
    request.model_spec.version_label = "stable"
    return request


def _signature() -> Any:
    request = _predict("add", input=ROWS)
    request.model_spec.signature_name = "train"
    return request


def _metadata(*fields: str) -> Any:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=list(fields))
    request.model_spec.name = "add"
    return request


def _classify(model: str) -> Any:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.input.example_list.examples.append(_example(a=[1.0] * 4, b=[1.0] * 4))
    return request


#: Each bad call: the RPC, the request (made when the test runs: a request made at collection
#: imports TensorFlow there), its code, and what the reason must say.
NOT_FOUND, INVALID = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT
BAD: list[tuple[str, Callable[[], Any], grpc.StatusCode, str]] = [
    ("Predict", partial(_predict, "nope", input=ROWS), NOT_FOUND, "nope"),
    ("Predict", partial(_predict, "add", 7, input=ROWS), NOT_FOUND, "7"),
    ("Predict", partial(_predict, "add", input=ROWS.astype(np.float64)), INVALID,
     "is DT_DOUBLE; the model takes DT_FLOAT"),
    ("Predict", partial(_predict, "add", other=ROWS), INVALID, "no input 'other'"),
    ("Predict", _bad_content, INVALID, "tensor_content has 5"),
    ("Predict", _label, NOT_FOUND, "no version label"),
    ("Predict", partial(_filtered, "nope"), INVALID, "nope"),
    ("Predict", partial(_typed, "half_val", 3), INVALID, "3 values in half_val"),
    ("Predict", _signature, INVALID, "no signature 'train'"),
    ("Predict", partial(_predict, "add", input=ROWS[:, :2]), INVALID, "shape"),
    ("Classify", partial(_classify, "sumdiff"), INVALID, "cannot classify"),
    ("Regress", partial(_classify, "sumdiff"), INVALID, "cannot regress"),
    ("Classify", lambda: classification_pb2.ClassificationRequest(model_spec={"name": "add"}),
     INVALID, "no examples"),
    ("GetModelMetadata", _metadata, INVALID, "signature_def"),
    ("GetModelMetadata", partial(_metadata, "graph"), INVALID, "'graph'"),
]  # fmt: skip


@pytest.mark.parametrize(("rpc", "request_", "code", "said"), BAD)
def test_a_bad_call_is_refused_with_the_reason(
    stub: prediction_service_pb2_grpc.PredictionServiceStub,
    rpc: str,
    request_: Callable[[], Any],
    code: grpc.StatusCode,
    said: str,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, rpc)(request_(), timeout=30)
    assert caught.value.code() == code, caught.value.details()
    assert said in (caught.value.details() or "")
    assert stub.Predict(_predict("add", input=ROWS), timeout=30).outputs  # still serving
