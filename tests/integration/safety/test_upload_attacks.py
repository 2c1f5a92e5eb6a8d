"""Issue 33, finding 1: a load request's uploaded files never run code the client chose.

Each test uploads, as an attacker would, a file whose loading would run code (a zoo spec naming
`subprocess:run` or `os:system`, a pickle, TorchScript, an AOTInductor library, a custom-op
library, Python, vLLM engine arguments) or read the host's files (ONNX external data), over REST
and gRPC `RepositoryModelLoad`. The command it carries would create a marker file: the marker
never appears, the answer is a 4xx that names the rule, and the server keeps serving. A zoo spec
naming the zoo's own factory still loads from an upload and answers.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from onnx import TensorProto, helper
from tests.toolkit.repositories import triton_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

from dlscale.models.zoo import ZOO
from dlscale.models.zoo.inputs import torch_entry
from dlscale.serving.control.uploads import MAX_FILE_DEPTH

TORCH = {
    "platform": "pytorch_libtorch",
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [16]}],
}
ONNX = TORCH | {"platform": "onnxruntime_onnx"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with serving(triton_repository(tmp_path_factory.mktemp("uploads"))) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(server: LocalServer) -> Iterator[tg.InferenceServerClient]:
    with tg.InferenceServerClient(server.grpc_url) as client:
        yield client


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """The file the attacker's command would create."""
    return tmp_path / "ran"


def _load(http: httpx.Client, name: str, config: dict[str, Any], **files: bytes) -> httpx.Response:
    params = {"config": json.dumps(config | {"name": name})}
    params |= {f"file:{k}": base64.b64encode(v).decode() for k, v in files.items()}
    return http.post(f"/v2/repository/models/{name}/load", json={"parameters": params})


def _refused(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for fragment in fragments:
        assert fragment in error, error


def _still_serving(http: httpx.Client) -> None:
    row = {"shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}
    doc = {"inputs": [row | {"name": "INPUT0"}, row | {"name": "INPUT1"}]}
    assert http.post("/v2/models/simple/infer", json=doc).status_code == 200


def _zoo_spec(factory: str, **kwargs: Any) -> bytes:
    lines = [f"factory = {json.dumps(factory)}", "[kwargs]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in kwargs.items()]
    lines += ["[[inputs]]", 'name = "x"', 'datatype = "FP32"', "shape = [-1, 16]"]
    lines += ["[[outputs]]", 'name = "y"', 'datatype = "FP32"', "shape = [-1, 16]"]
    return "\n".join(lines).encode()


class _Touch:
    """A pickle that creates a file when it is loaded: what a hostile pickle does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def _pickled_archive(marker: Path) -> bytes:
    """A zip with a hostile pickle inside, as a torch.export or TorchScript archive holds one."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(_Touch(marker)))
    return buffer.getvalue()


# -- a model.zoo names one of the zoo's own factories, checked before anything is imported ------


@pytest.mark.parametrize(
    ("factory", "kwargs"),
    [
        ("subprocess:run", {"args": "touch {marker}", "shell": True}),
        ("os:system", {"command": "touch {marker}"}),
        ("pathlib:Path.touch", {}),
        ("json:loads", {"s": "1"}),
        ("dlscale.models.zoo.nets.small.os:system", {"command": "touch {marker}"}),
        ("dlscale.models.zoo.nets.digits:train", {"seed": 0}),
    ],
)
def test_a_zoo_spec_naming_other_code_is_refused_before_it_runs(
    http: httpx.Client, marker: Path, factory: str, kwargs: dict[str, Any]
) -> None:
    filled = {k: v.format(marker=marker) if isinstance(v, str) else v for k, v in kwargs.items()}
    response = _load(http, "zoo-attack", TORCH, **{"1/model.zoo": _zoo_spec(factory, **filled)})
    _refused(response, 400, "is not one of the zoo's factories")
    assert not marker.exists()
    _still_serving(http)


def test_a_zoo_spec_naming_other_code_is_refused_over_grpc(
    grpc_client: tg.InferenceServerClient, marker: Path
) -> None:
    spec = _zoo_spec("subprocess:run", args=f"touch {marker}", shell=True)
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.load_model(
            "zoo-attack",
            config=json.dumps(TORCH | {"name": "zoo-attack"}),
            files={"file:1/model.zoo": spec},
        )
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "is not one of the zoo's factories" in str(caught.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [(b"\xff\xfe factory", "codec can't decode"), (b"factory = [", "not valid TOML")],
)
def test_a_zoo_spec_that_is_not_toml_text_is_a_client_error(
    http: httpx.Client, spec: bytes, fragment: str
) -> None:
    _refused(_load(http, "zoo-junk", TORCH, **{"1/model.zoo": spec}), 400, fragment)
    _still_serving(http)


def test_a_zoo_factorys_arguments_must_be_its_own(http: httpx.Client) -> None:
    spec = _zoo_spec(ZOO["mlp"].factory, seed=0, shell=True)
    _refused(_load(http, "zoo-kwargs", TORCH, **{"1/model.zoo": spec}), 400, "kwargs")


def test_the_zoos_own_factory_loads_from_an_upload_and_answers(
    http: httpx.Client, tmp_path: Path
) -> None:
    spec = torch_entry(ZOO["mlp"]).write(tmp_path / "model.zoo").read_bytes()
    inputs = [s.with_batch() for s in ZOO["mlp"].inputs()]
    outputs = [s.with_batch() for s in ZOO["mlp"].outputs()]
    config = TORCH | {
        "input": [_tensor(s.name, s.datatype.value, s.shape[1:]) for s in inputs],
        "output": [_tensor(s.name, s.datatype.value, s.shape[1:]) for s in outputs],
    }
    response = _load(http, "zoo-mlp", config, **{"1/model.zoo": spec})
    assert response.status_code == 200, response.text
    row = np.zeros(inputs[0].shape[1:], np.float32)
    doc = {
        "inputs": [
            {
                "name": inputs[0].name,
                "shape": [1, *row.shape],
                "datatype": "FP32",
                "data": row.ravel().tolist(),
            }
        ]
    }
    assert http.post("/v2/models/zoo-mlp/infer", json=doc).status_code == 200
    assert http.post("/v2/repository/models/zoo-mlp/unload").status_code == 200


def _tensor(name: str, datatype: str, dims: tuple[int, ...]) -> dict[str, Any]:
    return {"name": name, "data_type": f"TYPE_{datatype}", "dims": list(dims)}


# -- files whose loading runs code come from the repository only --------------------------------


@pytest.mark.parametrize(
    ("config", "file_name"),
    [
        (TORCH, "model.pt2"),  # torch.export.load falls back to a full unpickling
        (TORCH, "model.pt"),  # TorchScript
        (TORCH, "model.aoti.pt2"),  # a shared library the loader dlopens
        (TORCH | {"default_model_filename": "weights.pkl"}, "weights.pkl"),
        (ONNX, "libcustom_ops.so"),
        (ONNX, "model.py"),
        ({"backend": "vllm", "max_batch_size": 0}, "model.json"),  # engine args name classes
        ({"backend": "vllm", "max_batch_size": 0}, "pytorch_model.bin"),
        ({"backend": "vllm", "max_batch_size": 0}, "modeling_evil.py"),
    ],
)
def test_a_file_that_holds_code_is_refused_before_it_is_written(
    http: httpx.Client, server: LocalServer, marker: Path, config: dict[str, Any], file_name: str
) -> None:
    payload = _pickled_archive(marker)
    response = _load(http, "code-attack", config, **{f"1/{file_name}": payload})
    _refused(response, 403, "may not upload", file_name, "model repository")
    assert not marker.exists()
    assert "code-attack" not in server.dataplane.uploads.names()
    _still_serving(http)


def test_a_pickled_archive_is_refused_over_grpc(
    grpc_client: tg.InferenceServerClient, marker: Path
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.load_model(
            "code-attack",
            config=json.dumps(TORCH | {"name": "code-attack"}),
            files={"file:1/model.pt2": _pickled_archive(marker)},
        )
    assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
    assert not marker.exists()


def test_a_pipeline_takes_no_uploaded_files(http: httpx.Client) -> None:
    config = {
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [16]}],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "simple",
                    "model_version": -1,
                    "input_map": {"INPUT0": "x"},
                    "output_map": {"OUTPUT0": "y"},
                }
            ]
        },
    }
    _refused(_load(http, "pipe-attack", config, **{"1/model.zoo": b"x"}), 403, "no files")


# -- an uploaded ONNX model reads its external data from beside it only --------------------------


def _onnx_with_external(location: str) -> bytes:
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16])
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 16])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], initializer=[weight]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.parametrize(
    "location", ["/etc/passwd", "../../../../../../etc/passwd", "sub/../../x", "C:/x"]
)
def test_onnx_external_data_outside_the_folder_is_refused(
    http: httpx.Client, location: str
) -> None:
    files = {"1/model.onnx": _onnx_with_external(location)}
    _refused(_load(http, "onnx-attack", ONNX, **files), 403, "outside its folder")
    _still_serving(http)


def test_onnx_external_data_beside_the_model_loads(http: httpx.Client) -> None:
    weights = np.arange(16, dtype=np.float32)
    files = {"1/model.onnx": _onnx_with_external("w.data"), "1/w.data": weights.tobytes()}
    response = _load(http, "onnx-external", ONNX, **files)
    assert response.status_code == 200, response.text
    doc = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
    answer = http.post("/v2/models/onnx-external/infer", json=doc).json()
    assert answer["outputs"][0]["data"] == (weights + 1).tolist()
    http.post("/v2/repository/models/onnx-external/unload")


def test_an_upload_that_is_not_onnx_is_a_client_error(http: httpx.Client) -> None:
    _refused(_load(http, "onnx-junk", ONNX, **{"1/model.onnx": b"\xff" * 64}), 400, "ONNX")


# -- file names: bounded depth, ASCII versions ---------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["1/" + "d/" * 2000 + "model.onnx", "¹/model.onnx", "0/model.onnx", "1" * 40 + "/model.onnx"],
)
def test_upload_paths_are_bounded(http: httpx.Client, key: str) -> None:
    response = _load(http, "path-attack", ONNX, **{key: _onnx_with_external("w.data")})
    _refused(response, 400, "positive version in ASCII digits", f"{MAX_FILE_DEPTH} names deep")
    _still_serving(http)
