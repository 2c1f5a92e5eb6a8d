"""TensorFlow Serving's REST API over ONNX and null models, with a client written from its
document (httpx): the same request answers as the Open Inference Protocol's route does, and each
malformed request gets its 4xx in TensorFlow Serving's shape, `{"error": "..."}`, after which the
server keeps serving.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.clients import RawHttp
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.tfserving import ADDEND

ROWS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]


def _oip(triton: th.InferenceServerClient, model: str, **arrays: np.ndarray) -> th.InferResult:
    inputs = []
    for name, array in arrays.items():
        given = th.InferInput(name, list(array.shape), th.np_to_triton_dtype(array.dtype))
        given.set_data_from_numpy(array, binary_data=False)
        inputs.append(given)
    return triton.infer(model, inputs)


def _ok(http: httpx.Client, path: str, body: Any) -> Any:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_rows_and_columns_answer_as_the_oip_route(
    http: httpx.Client, triton: th.InferenceServerClient
) -> None:
    x = np.array(ROWS, np.float32)
    want = _oip(triton, "add", input=x).as_numpy("output")
    rows = _ok(http, "/add:predict", {"instances": ROWS})["predictions"]
    columns = _ok(http, "/add:predict", {"inputs": ROWS, "signature_name": "serving_default"})
    np.testing.assert_array_equal(np.array(rows, np.float32), want)
    np.testing.assert_array_equal(np.array(columns["outputs"], np.float32), want)
    np.testing.assert_array_equal(want, x + ADDEND)


def test_named_inputs_and_outputs_answer_as_the_oip_route(
    http: httpx.Client, triton: th.InferenceServerClient
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, np.float32)
    oip = _oip(triton, "sumdiff", a=a, b=b)
    rows = [{"a": ra.tolist(), "b": rb.tolist()} for ra, rb in zip(a, b, strict=True)]
    predictions = _ok(http, "/sumdiff/versions/1:predict", {"instances": rows})["predictions"]
    columns = _ok(http, "/sumdiff:predict", {"inputs": {"a": a.tolist(), "b": b.tolist()}})
    for name in ("sum", "diff"):
        want = oip.as_numpy(name)
        np.testing.assert_array_equal(np.array([p[name] for p in predictions], np.float32), want)
        np.testing.assert_array_equal(np.array(columns["outputs"][name], np.float32), want)


def test_integer_inputs_keep_their_datatype(
    http: httpx.Client, triton: th.InferenceServerClient
) -> None:
    a, b = np.ones((1, 4), np.float32), np.array([[1, -2, 3, 2**31 - 1]], np.int32)
    oip = _oip(triton, "mixed", a=a, b=b)
    got = _ok(http, "/mixed:predict", {"inputs": {"a": a.tolist(), "b": b.tolist()}})["outputs"]
    np.testing.assert_array_equal(np.array(got["b_copy"], np.int32), oip.as_numpy("b_copy"))
    np.testing.assert_array_equal(np.array(got["sum"], np.float32), oip.as_numpy("sum"))


def test_strings_travel_as_text_and_b64(http: httpx.Client) -> None:
    blob = bytes([0, 1, 2, 255])
    encoded = base64.b64encode(blob).decode()
    row = {
        "text": ["héllo", {"b64": base64.b64encode(b"raw").decode()}],
        "blob": [{"b64": encoded}],
    }
    (answer,) = _ok(http, "/words:predict", {"instances": [row]})["predictions"]
    # text_out goes back as text; blob_bytes, named so, as {"b64": ...} (TF Serving's rule).
    assert answer == {"text_out": ["héllo", "raw"], "blob_bytes": [{"b64": encoded}]}


def test_half_floats_travel_as_json_numbers(http: httpx.Client) -> None:
    assert _ok(http, "/half:predict", {"instances": [[1.5, -2.25]]}) == {
        "predictions": [[1.5, -2.25]]
    }


def test_bytes_that_are_not_utf8_come_back_as_b64(http: httpx.Client) -> None:
    raw = {"b64": base64.b64encode(b"\xff\xfe").decode()}
    row = {"text": [raw, "ok"], "blob": ["x"]}
    (answer,) = _ok(http, "/words:predict", {"instances": [row]})["predictions"]
    assert answer["text_out"] == [raw, "ok"]


def _doc_calls() -> list[tuple[str, str | None]]:
    text = (Path(__file__).resolve().parents[3] / "docs" / "tfserving.md").read_text()
    found = re.findall(r"curl -s localhost:8000(\S+)(?: -d '(.*?)')?\n", text)
    return [(path, body or None) for path, body in found]


def test_the_docs_curl_examples_answer(server: LocalServer) -> None:
    calls = _doc_calls()
    assert len(calls) == 4
    for path, body in calls:
        url = f"http://{server.http_url}{path}"
        response = httpx.post(url, content=body) if body else httpx.get(url)
        assert response.status_code == 200, (path, response.text)
        assert "error" not in response.json()


def test_classify_names_classes_by_index_or_by_the_classes_output(http: httpx.Client) -> None:
    result = _ok(http, "/add:classify", {"examples": [{"input": ROWS[0]}, {"input": ROWS[1]}]})
    want = np.array(ROWS) + ADDEND
    assert result["result"] == [[[str(i), v] for i, v in enumerate(row)] for row in want.tolist()]
    body = {"context": {"names": ["cat", "dog", "eel"]}, "examples": [{"x": [0.25, 0.5, 0.125]}]}
    labeled = _ok(http, "/labeled:classify", body)
    assert labeled["result"] == [[["cat", 0.25], ["dog", 0.5], ["eel", 0.125]]]


def test_regress_gives_one_value_per_example(http: httpx.Client) -> None:
    body = {"examples": [{"input": 2.0}, {"input": [3.0]}], "signature_name": "serving_default"}
    assert _ok(http, "/one:regress", body) == {"result": [2.5, 3.5]}


def test_status_and_metadata_in_tf_serving_shape(http: httpx.Client) -> None:
    available = {"version": "1", "state": "AVAILABLE"}
    ok = {"error_code": "OK", "error_message": ""}
    for path in ("/add", "/add/versions/1"):
        assert http.get(path).json() == {"model_version_status": [{**available, "status": ok}]}
    meta = http.get("/sumdiff/metadata").json()
    assert meta["model_spec"] == {"name": "sumdiff", "signature_name": "", "version": "1"}
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert sorted(signature["inputs"]) == ["a", "b"] and sorted(signature["outputs"]) == [
        "diff",
        "sum",
    ]
    dims = [{"size": "-1", "name": ""}, {"size": "4", "name": ""}]
    assert signature["inputs"]["a"] == {
        "dtype": "DT_FLOAT",
        "tensor_shape": {"dim": dims, "unknown_rank": False},
        "name": "a",
    }
    words = http.get("/words/versions/1/metadata").json()["metadata"]["signature_def"]
    assert words["signature_def"]["serving_default"]["inputs"]["text"]["dtype"] == "DT_STRING"


NESTED = [[1.0]]
for _ in range(80):
    NESTED = [NESTED]

#: Each bad request: path (under /v1/models), body, the status, and what the error must say.
BAD: list[tuple[str, Any, int, str]] = [
    ("/add:predict", {"instances": [[1, 2, 3], [4, 5]]}, 400, "ragged"),
    ("/add:predict", {"instances": [[1, 2, 3], [4, [5], 6]]}, 400, "ragged"),
    ("/sumdiff:predict", {"instances": [{"a": [1] * 4, "b": [1] * 4}, [1] * 4]}, 400, "same form"),
    ("/sumdiff:predict", {"instances": [[1] * 4, {"a": [1] * 4}]}, 400, "mixes rows"),
    ("/sumdiff:predict", {"instances": [{"a": [1] * 4, "b": [1] * 4}, {"a": [1] * 4}]}, 400,
     "must name the same inputs"),
    ("/sumdiff:predict", {"instances": [[1] * 4]}, 400, "has 2 inputs"),
    ("/add:predict", {"instances": ROWS, "inputs": ROWS}, 400, "not both"),
    ("/add:predict", {"signature_name": "serving_default"}, 400, "exactly one of 'instances'"),
    ("/add:predict", {}, 400, "exactly one of 'instances'"),
    ("/add:predict", {"instances": []}, 400, "non-empty list"),
    ("/add:predict", {"instances": ROWS, "signature_name": "train"}, 400, "no signature 'train'"),
    ("/add:predict", {"instances": ROWS, "signature_name": 3}, 400, "must be a string"),
    ("/add:predict", {"instances": ROWS, "model_spec": {}}, 400, "unknown field 'model_spec'"),
    ("/add:predict", b'{"instances": [[1, 2', 400, "malformed JSON"),
    ("/add:predict", b"[1, 2, 3]", 400, "must be a JSON object"),
    ("/add:predict", {"inputs": {"nope": ROWS}}, 400, "has no input 'nope'"),
    ("/add:predict", {"instances": [["a", "b", "c"]]}, 400, "must hold numbers"),
    ("/add:predict", {"instances": [[{"b64": "AAAA"}] * 3]}, 400, "must hold numbers"),
    ("/add:predict", {"instances": [NESTED]}, 400, "nested deeper"),
    ("/add:predict", {"instances": [[1, 2, 3, 4]]}, 400, "shape"),
    ("/mixed:predict", {"inputs": {"a": [[1] * 4], "b": [[2**40] * 4]}}, 400, "outside the range"),
    ("/words:predict", {"instances": [{"text": ["a", "b"], "blob": [{"b64": "%%%"}]}]}, 400,
     "is not valid base64"),
    ("/words:predict", {"instances": [{"text": ["a", 3], "blob": ["x"]}]}, 400,
     "each element must be text"),
    ("/words:predict", {"instances": [{"text": ["a", ["b"]], "blob": ["x"]}]}, 400, "ragged"),
    ("/sumdiff:classify", {"examples": [{"a": [1] * 4, "b": [1] * 4}]}, 400, "cannot classify"),
    ("/add:regress", {"examples": [{"input": [1, 2, 3]}]}, 400, "cannot regress"),
    ("/add:classify", {"examples": []}, 400, "non-empty list"),
    ("/add:classify", {"examples": [[1, 2, 3]]}, 400, "list of objects"),
    ("/add:classify", {"examples": [{"input": [1, 2, 3]}], "context": [1]}, 400,
     "'context' must be an object"),
    ("/add:classify", {"instances": ROWS}, 400, "unknown field 'instances'"),
    ("/nope:predict", {"instances": ROWS}, 404, "nope"),
    ("/add/versions/7:predict", {"instances": ROWS}, 404, "7"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "said"), BAD)
def test_a_bad_request_is_refused_with_the_reason(
    http: httpx.Client, path: str, body: Any, status: int, said: str
) -> None:
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error, str) and said in error, error
    assert _ok(http, "/add:predict", {"instances": ROWS})["predictions"]  # still serving


@pytest.mark.parametrize(
    ("method", "path", "status", "said"),
    [
        ("GET", "/add/versions/7", 404, "version 7"),
        ("GET", "/nope/metadata", 404, "nope"),
        ("GET", "/add:predict", 405, "use POST"),
        ("POST", "/add/metadata", 405, "use GET"),
        ("GET", "/add/labels/stable", 404, "no version labels"),
        ("POST", "/add/labels/stable:predict", 404, "no version labels"),
    ],
)
def test_a_bad_status_or_metadata_call_is_refused(
    http: httpx.Client, method: str, path: str, status: int, said: str
) -> None:
    response = http.request(method, path)
    assert response.status_code == status, response.text
    assert said in response.json()["error"]
    assert http.get("/add").status_code == 200


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    server: LocalServer, http: httpx.Client
) -> None:
    limit = server.http.limits.max_body_bytes
    with RawHttp(server.http.port) as raw:
        raw.send(
            b"POST /v1/models/add:predict HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {limit + 1}\r\n\r\n".encode()
        )
        status, _, body = raw.response()
    assert status == 413 and b"exceeds the limit" in body
    assert _ok(http, "/add:predict", {"instances": ROWS})["predictions"]


def test_rest_worker_processes_answer_the_same(repo: Path, http: httpx.Client) -> None:
    # Behind --http-workers the routes run in other processes, over the model process's plane.
    here = _ok(http, "/sumdiff:predict", {"instances": [{"a": [1, 2, 3, 4], "b": [4, 3, 2, 1]}]})
    with serving(repo, http_workers=1, grpc_port=None) as workers:
        base = f"http://{workers.http_url}/v1/models"
        with httpx.Client(base_url=base, timeout=60) as there:
            body = {"instances": [{"a": [1, 2, 3, 4], "b": [4, 3, 2, 1]}]}
            assert _ok(there, "/sumdiff:predict", body) == here
            assert there.get("/sumdiff").json()["model_version_status"][0]["state"] == "AVAILABLE"
            assert "serving_default" in there.get("/sumdiff/metadata").text
            refused = there.post("/sumdiff:predict", json={"instances": [[1] * 4]})
            assert refused.status_code == 400 and "has 2 inputs" in refused.json()["error"]
