"""The TensorFlow backend served: SavedModels and .keras files behind the real server.

One server (module scope) holds good TensorFlow models, answered through the real tritonclient
and compared with TensorFlow in process, and bad ones that must fail to load with their reason
(unknown signature, custom op, a config that contradicts the signature). Uploads of TensorFlow
files are attacked as test_upload_attacks.py attacks the others': a SavedModel whose signature
writes a file, a custom-op graph, a Keras Lambda; the marker file never appears.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.server import LocalServer, serving

#: The toolkit's dense models' width (tests/toolkit/tf_models.py).
FEATURES = 16
BATCHED_PBTXT = (
    'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'
    "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
)
TOML = 'backend = "tensorflow"\nmax_batch_size = 8\n'


def _version(root: Path, name: str, config: tuple[str, str]) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / config[0]).write_text(config[1])
    return root / name / "1"


@pytest.fixture(scope="module")
def tf_models() -> Any:
    """The toolkit's TensorFlow builders, imported only where a test of this module runs (not at
    collection: TensorFlow takes seconds and memory in every worker that imports it)."""
    return pytest.importorskip("tests.toolkit.tf_models", reason="needs the [tensorflow] extra")


@pytest.fixture(scope="module")
def repo(tf_models: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("tf")
    models = {
        "dense": tf_models.write_dense_savedmodel(
            _version(root, "tf-dense", ("config.pbtxt", BATCHED_PBTXT)) / "model.savedmodel"
        ),
        "keras": tf_models.write_dense_keras(
            _version(root, "tf-keras", ("config.toml", TOML)) / "model.keras", seed=1
        ),
    }
    tf_models.write_text_savedmodel(
        _version(root, "tf-text", ("config.toml", TOML)) / "model.savedmodel"
    )
    signature = TOML + '[backend_options]\nsignature = "nope"\n'
    tf_models.write_dense_savedmodel(
        _version(root, "bad-signature", ("config.toml", signature)) / "model.savedmodel"
    )
    custom = _version(root, "bad-custom-op", ("config.toml", TOML)) / "model.savedmodel"
    tf_models.write_dense_savedmodel(custom)
    tf_models.rename_op(custom, "MatMul", "DlscaleSecretMatMul")
    wrong = TOML + '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [9]\n'
    tf_models.write_dense_savedmodel(
        _version(root, "bad-shape", ("config.toml", wrong)) / "model.savedmodel"
    )
    option = TOML + "[backend_options]\nxla = true\n"
    tf_models.write_dense_keras(
        _version(root, "bad-option", ("config.toml", option)) / "model.keras"
    )
    return root, models


@pytest.fixture(scope="module")
def server(repo: tuple[Path, dict[str, Any]]) -> Iterator[LocalServer]:
    with serving(repo[0], max_body_bytes=64 * 2**20) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[th.InferenceServerClient]:
    client = th.InferenceServerClient(server.http_url, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def rest(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=120) as client:
        yield client


def _infer(client: Any, module: Any, model: str, x: np.ndarray, output: str) -> np.ndarray:
    data = module.InferInput("x", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    return np.asarray(client.infer(model, [data]).as_numpy(output))


# -- good models answer as TensorFlow does in process -------------------------------------------


def test_a_savedmodel_without_a_config_of_tensors_is_described_from_its_signature(
    http: th.InferenceServerClient,
) -> None:
    meta = http.get_model_metadata("tf-dense")
    assert meta["platform"] == "tensorflow_savedmodel"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, FEATURES]}]
    assert meta["outputs"] == [{"name": "output_0", "datatype": "FP32", "shape": [-1, 4]}]


def test_a_savedmodel_answers_as_tensorflow_in_process(
    tf_models: Any,
    server: LocalServer,
    http: th.InferenceServerClient,
    repo: tuple[Path, dict[str, Any]],
) -> None:
    x = np.random.default_rng(0).standard_normal((5, FEATURES)).astype(np.float32)
    want = tf_models.reference(repo[1]["dense"], x)
    np.testing.assert_allclose(_infer(http, th, "tf-dense", x, "output_0"), want, rtol=1e-5)
    with tg.InferenceServerClient(server.grpc_url) as grpc:
        got = _infer(grpc, tg, "tf-dense", x, "output_0")
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_concurrent_rows_are_batched_and_each_gets_its_own_answer(
    tf_models: Any, http: th.InferenceServerClient, repo: tuple[Path, dict[str, Any]]
) -> None:
    rows = np.random.default_rng(1).standard_normal((24, 1, FEATURES)).astype(np.float32)
    pending = []
    for row in rows:  # in flight together: tritonclient's async_infer, 8 connections
        data = th.InferInput("x", list(row.shape), "FP32")
        data.set_data_from_numpy(row)
        pending.append(http.async_infer("tf-dense", [data]))
    answers = [p.get_result().as_numpy("output_0") for p in pending]
    stats = http.get_inference_statistics("tf-dense")["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"]  # some batches held several
    want = tf_models.reference(repo[1]["dense"], rows[:, 0])
    np.testing.assert_allclose(np.concatenate(answers), want, rtol=1e-5, atol=1e-6)


def test_a_keras_file_answers_as_keras_in_process(
    tf_models: Any, http: th.InferenceServerClient, repo: tuple[Path, dict[str, Any]]
) -> None:
    meta = http.get_model_metadata("tf-keras")
    assert meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 4]}]
    x = np.random.default_rng(2).standard_normal((3, FEATURES)).astype(np.float32)
    got = _infer(http, th, "tf-keras", x, "scores")
    np.testing.assert_allclose(got, tf_models.reference(repo[1]["keras"], x), rtol=1e-5)


def test_bytes_travel_as_tf_strings_both_ways(http: th.InferenceServerClient) -> None:
    text = np.array([b"abc", b"", "caf\u00e9".encode(), b"\xff\x00z"], dtype=object)
    data = th.InferInput("text", [4], "BYTES")
    data.set_data_from_numpy(text)
    result = http.infer("tf-text", [data])
    assert result.as_numpy("length").tolist() == [3, 0, 5, 3]
    assert result.as_numpy("upper").tolist() == [b"ABC", b"", "CAF\u00e9".encode(), b"\xff\x00Z"]


def test_a_wrong_dtype_or_shape_is_refused_before_tensorflow(rest: httpx.Client) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    response = rest.post("/v2/models/tf-dense/infer", json=doc)
    assert response.status_code == 400 and "shape" in response.json()["error"]
    doc = {"inputs": [{"name": "text", "shape": [1], "datatype": "INT32", "data": [1]}]}
    response = rest.post("/v2/models/tf-text/infer", json=doc)
    assert response.status_code == 400 and "BYTES" in response.json()["error"]


# -- bad models are refused at load, with the reason --------------------------------------------


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad-signature", "no signature 'nope' (it has ['serve', 'serving_default'])"),
        ("bad-custom-op", "ops TensorFlow does not have: ['DlscaleSecretMatMul']"),
        ("bad-shape", "inputs.x.shape"),
        ("bad-option", "backend_options ['xla']: the tensorflow backend reads"),
    ],
)
def test_a_bad_savedmodel_is_refused_at_load_with_its_reason(
    http: th.InferenceServerClient, model: str, reason: str
) -> None:
    index = {row["name"]: row for row in http.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"]
    assert http.is_model_ready("tf-dense")


# -- uploads: data only --------------------------------------------------------------------------

UPLOAD_CONFIG = {"platform": "tensorflow_savedmodel", "max_batch_size": 8}


def _load(
    rest: httpx.Client, name: str, files: dict[str, bytes], backend: str = ""
) -> httpx.Response:
    config = {"backend": backend, "max_batch_size": 8} if backend else UPLOAD_CONFIG
    params = {"config": json.dumps(config | {"name": name})}
    params |= {f"file:{k}": base64.b64encode(v).decode() for k, v in files.items()}
    return rest.post(f"/v2/repository/models/{name}/load", json={"parameters": params})


def _refused(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    for fragment in fragments:
        assert fragment in response.json()["error"], response.json()["error"]


def test_an_uploaded_savedmodel_loads_and_answers(
    tf_models: Any, rest: httpx.Client, http: th.InferenceServerClient, tmp_path: Path
) -> None:
    model = tf_models.write_dense_savedmodel(tmp_path / "m", seed=3)
    response = _load(
        rest, "tf-upload", tf_models.folder_files(tmp_path / "m", "1/model.savedmodel")
    )
    assert response.status_code == 200, response.text
    x = np.ones((2, FEATURES), np.float32)
    got = _infer(http, th, "tf-upload", x, "output_0")
    np.testing.assert_allclose(got, tf_models.reference(model, x), rtol=1e-5)
    http.unload_model("tf-upload")


def test_an_uploaded_savedmodel_that_writes_a_file_is_refused(
    tf_models: Any, rest: httpx.Client, server: LocalServer, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    tf_models.write_file_writing_savedmodel(tmp_path / "m", marker)
    files = tf_models.folder_files(tmp_path / "m", "1/model.savedmodel")
    _refused(_load(rest, "tf-writer", files), 403, "WriteFile", "model repository only")
    assert not marker.exists()
    assert "tf-writer" not in server.dataplane.uploads.names()


def test_an_uploaded_savedmodel_with_a_custom_op_is_refused(
    tf_models: Any, rest: httpx.Client, tmp_path: Path
) -> None:
    tf_models.write_dense_savedmodel(tmp_path / "m")
    tf_models.rename_op(tmp_path / "m", "MatMul", "DlscaleSecretMatMul")
    files = tf_models.folder_files(tmp_path / "m", "1/model.savedmodel")
    _refused(_load(rest, "tf-custom", files), 400, "DlscaleSecretMatMul", "custom-op library")


def test_an_uploaded_keras_lambda_is_refused_and_never_runs(
    tf_models: Any, rest: httpx.Client, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    tf_models.write_lambda_keras(tmp_path / "model.keras", marker)
    files = {"1/model.keras": (tmp_path / "model.keras").read_bytes()}
    _refused(_load(rest, "tf-lambda", files), 403, "Lambda", "model repository only")
    assert not marker.exists()


def test_an_uploaded_keras_file_loads_and_answers(
    tf_models: Any, rest: httpx.Client, http: th.InferenceServerClient, tmp_path: Path
) -> None:
    model = tf_models.write_dense_keras(tmp_path / "model.keras", seed=4)
    files = {"1/model.keras": (tmp_path / "model.keras").read_bytes()}
    response = _load(rest, "tf-keras-upload", files, backend="tensorflow")
    assert response.status_code == 200, response.text
    x = np.ones((2, FEATURES), np.float32)
    got = _infer(http, th, "tf-keras-upload", x, "scores")
    np.testing.assert_allclose(got, tf_models.reference(model, x), rtol=1e-5)
    http.unload_model("tf-keras-upload")


def test_uploaded_keras_weights_stored_in_a_host_file_are_refused(
    tf_models: Any, rest: httpx.Client, tmp_path: Path
) -> None:
    # An HDF5 external dataset: h5py would read the host file as the weights, and the model's
    # answers would carry its bytes back. Keras 3.15 refuses it at load too (a 400 after the
    # files are written); the upload check refuses it before a byte is written, whatever Keras.
    tf_models.write_dense_keras(tmp_path / "model.keras")
    data = tf_models.with_external_weights(tmp_path / "model.keras", tmp_path / "secret")
    response = _load(rest, "tf-h5", {"1/model.keras": data}, backend="tensorflow")
    _refused(response, 403, "stored in or linked to other files")


def test_an_uploaded_shared_library_is_refused_by_name(rest: httpx.Client) -> None:
    files = {"1/model.savedmodel/saved_model.pb": b"", "1/_custom_ops.so": b"\x7fELF"}
    _refused(_load(rest, "tf-so", files), 403, "_custom_ops.so", "may not upload")
