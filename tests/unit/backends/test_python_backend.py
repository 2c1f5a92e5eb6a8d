"""The python backend without a server: which API a model.py speaks, loading, batches request by
request for Triton models, user-code errors, where the code runs, and the configs that name it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.python_models import (
    ADD_SUB,
    CODED_ERRORS,
    SCALE,
    SCALE_CONFIG,
    triton_config,
    write_python_model,
    write_triton_python_model,
)

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.python import PythonBackend
from dlscale.backends.python import triton_python_backend_utils as pb_utils
from dlscale.backends.python.loader import UserCodeError, api_of
from dlscale.backends.python.pb_errors import code_of
from dlscale.errors import BackendError, ConfigError, DlscaleError, InvalidInput
from dlscale.models.config import ModelConfig, load_config
from dlscale.models.config_sections import BatchingConfig
from dlscale.models.repository import ModelRepository
from dlscale.models.runner import load_for_run
from dlscale.models.triton_config import load_pbtxt
from dlscale.serving.batcher import Batcher
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.types import Datatype, TensorSpec

X = TensorSpec("x", Datatype.FP32, (-1, 4))
Y = TensorSpec("y", Datatype.FP32, (-1, 4))
PAIR = (TensorSpec("INPUT0", Datatype.FP32, (-1, 4)), TensorSpec("INPUT1", Datatype.FP32, (-1, 4)))
OUTS = (
    TensorSpec("OUTPUT0", Datatype.FP32, (-1, 4)),
    TensorSpec("OUTPUT1", Datatype.FP32, (-1, 4)),
)

#: Triton's API, answering how many requests each execute saw (in every row of OUTPUT0).
COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        seen = len(requests)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative", pb_utils.TritonError.INVALID_ARG)
                out.append(pb_utils.InferenceResponse(error=error))
                continue
            count = pb_utils.Tensor("OUTPUT0", np.full_like(x, seen))
            out.append(pb_utils.InferenceResponse([count, pb_utils.Tensor("OUTPUT1", x)]))
        return out
"""


def _native(tmp_path: Path, code: str = SCALE, **extra: object) -> PythonBackend:
    folder = write_python_model(tmp_path, "scale", code, "")
    options = BackendOptions(max_batch_size=8, extra=extra, inputs=(X,), outputs=(Y,))
    return PythonBackend(folder / "1" / "model.py", options)


def _triton(tmp_path: Path, code: str, isolation: str = "thread") -> PythonBackend:
    folder = write_triton_python_model(tmp_path, "pair", code, "")
    options = BackendOptions(
        max_batch_size=8, extra={"isolation": isolation}, inputs=PAIR, outputs=OUTS
    )
    return PythonBackend(folder / "1" / "model.py", options)


def test_the_class_name_says_the_api(tmp_path: Path) -> None:
    for code, api in ((ADD_SUB, "triton"), (SCALE, "native")):
        (tmp_path / "model.py").write_text(code)
        assert api_of(tmp_path / "model.py") == api
    (tmp_path / "model.py").write_text("class Other:\n    pass\n")
    with pytest.raises(ConfigError, match="neither class 'TritonPythonModel'"):
        api_of(tmp_path / "model.py")


def test_a_native_model_loads_once_and_infers_batches(tmp_path: Path) -> None:
    backend = _native(tmp_path, factor=2.0)
    backend.load()
    assert backend.capabilities.calls_models and not backend.capabilities.takes_requests
    assert backend.isolation == "thread"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(backend.infer({"x": x})["y"], 2 * x)
    backend.unload()


def test_triton_models_run_in_a_worker_unless_told_otherwise(tmp_path: Path) -> None:
    folder = write_triton_python_model(tmp_path, "pair", ADD_SUB, "")
    options = BackendOptions(inputs=PAIR, outputs=OUTS)
    backend = create_backend("python", folder / "1" / "model.py", options)
    assert isinstance(backend, PythonBackend)
    assert backend.isolation == "process"
    with pytest.raises(ConfigError, match=r"'backend_options\.isolation'"):
        _native(tmp_path, isolation="fiber")


def test_the_config_must_declare_the_tensors(tmp_path: Path) -> None:
    folder = write_python_model(tmp_path, "bare", SCALE, "")
    backend = PythonBackend(folder / "1" / "model.py", BackendOptions())
    with pytest.raises(ConfigError, match="needs the model's inputs and outputs"):
        backend.load()


def test_an_exception_in_user_code_is_a_server_error_with_its_traceback_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _native(tmp_path)
    backend.load()
    with (
        caplog.at_level(logging.ERROR, logger="dlscale.python"),
        pytest.raises(UserCodeError) as caught,
    ):
        backend.infer({"x": np.full((1, 4), np.inf, np.float32)})
    assert isinstance(caught.value, BackendError)
    assert "RuntimeError: infinite input" in caught.value.message
    assert "Traceback" not in caught.value.message
    assert "Traceback (most recent call last)" in caplog.text


def test_a_failing_load_names_the_model_and_the_step(tmp_path: Path) -> None:
    broken = "class Model:\n    def load(self, context):\n        raise OSError('no weights')\n"
    backend = _native(tmp_path, broken)
    with pytest.raises(UserCodeError, match=r"'scale': load raised OSError: no weights"):
        backend.load()


def test_execute_must_answer_every_request(tmp_path: Path) -> None:
    lazy = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    backend = _triton(tmp_path, lazy)
    backend.load()
    x = np.zeros((1, 4), np.float32)
    with pytest.raises(UserCodeError, match="expected a list of 1 InferenceResponse"):
        backend.infer_requests([{"INPUT0": x, "INPUT1": x}])
    # In a batch, each request is tried again alone: each gets the error of its own.
    for result in backend.infer_requests([{"INPUT0": x, "INPUT1": x}] * 2):
        assert isinstance(result, UserCodeError)
        assert "expected a list of 1 InferenceResponse" in str(result)


def test_a_batch_reaches_execute_as_its_requests_and_errors_stay_apart(tmp_path: Path) -> None:
    backend = _triton(tmp_path, COUNTING)

    async def main() -> list[object]:
        instance = Instance(backend, "pair-0")
        await instance.load()
        config = ModelConfig(
            name="pair", max_batch_size=8, batching=BatchingConfig(max_queue_delay_us=100_000)
        )
        policy = BatchPolicy.of(config)
        batcher = Batcher(policy, [instance], ModelStats("pair", "1"))
        batcher.start()
        sent = [np.full((rows, 4), v, np.float32) for rows, v in ((1, 1), (2, -1), (3, 2))]
        # Queued in one go, before the scheduler runs: they form one batch.
        futures = [batcher.submit({"INPUT0": x, "INPUT1": x}) for x in sent]
        results = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.close()
        await instance.close()
        return results

    first, refused, last = asyncio.run(main())
    assert isinstance(first, dict) and isinstance(last, dict)
    assert isinstance(refused, InvalidInput) and "negative" in str(refused)
    assert first["OUTPUT0"].shape == (1, 4) and last["OUTPUT0"].shape == (3, 4)
    assert (first["OUTPUT0"] == 3).all() and (last["OUTPUT0"] == 3).all()  # one execute of 3
    np.testing.assert_array_equal(last["OUTPUT1"], np.full((3, 4), 2, np.float32))


#: Answers each request with the TritonError whose code INPUT0's first element holds.
def test_a_responses_error_code_gives_the_status_triton_answers_with(tmp_path: Path) -> None:
    # Triton answers not-found 404, unavailable 503, unsupported 501, internal 500 and every
    # other code 400 (shared/reference/oip.md), each under its own gRPC code.
    backend = _triton(tmp_path, CODED_ERRORS)
    backend.load()
    codes = {
        pb_utils.TritonError.INVALID_ARG: (400, "INVALID_ARGUMENT"),
        pb_utils.TritonError.NOT_FOUND: (404, "NOT_FOUND"),
        pb_utils.TritonError.UNAVAILABLE: (503, "UNAVAILABLE"),
        pb_utils.TritonError.UNSUPPORTED: (501, "UNIMPLEMENTED"),
        pb_utils.TritonError.INTERNAL: (500, "INTERNAL"),
        pb_utils.TritonError.UNKNOWN: (400, "UNKNOWN"),
        pb_utils.TritonError.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
        pb_utils.TritonError.CANCELLED: (400, "CANCELLED"),
    }
    requests = [{"INPUT0": np.full((1, 4), c, np.float32)} for c in codes]
    results = backend.infer_requests([{**r, "INPUT1": r["INPUT0"]} for r in requests])
    backend.unload()
    assert [(type(r).http_status, type(r).grpc_code) for r in results] == list(codes.values())
    assert all(isinstance(r, DlscaleError) and "coded" in str(r) for r in results)
    # A BLS caller gets each code back as it was sent.
    assert [code_of(r) for r in results] == list(codes)  # type: ignore[arg-type]


def test_configs_name_the_python_backend(tmp_path: Path) -> None:
    folder = write_triton_python_model(
        tmp_path, "pair", ADD_SUB, triton_config("pair", isolation="thread")
    )
    config, ignored = load_pbtxt(folder / "config.pbtxt", "pair")
    assert config.backend == "python" and config.platform_name == "python"
    assert config.backend_options.model_extra == {
        "parameters": {"DLSCALE_ISOLATION": "thread"},
        "isolation": "thread",
    }
    assert ignored == ()
    native = write_python_model(tmp_path, "scale", SCALE, SCALE_CONFIG.format(isolation="process"))
    config = load_config(native / "config.toml", "scale")
    assert config.backend == "python" and config.model_files() == ("model.py",)
    assert (config.backend_options.model_extra or {})["isolation"] == "process"


def test_models_check_loads_a_python_model_from_its_config(tmp_path: Path) -> None:
    write_python_model(tmp_path, "scale", SCALE, SCALE_CONFIG.format(isolation="thread"))
    backend = load_for_run(ModelRepository(tmp_path).version("scale"))
    try:
        x = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal(backend.infer({"x": x})["y"], 3 * x)
    finally:
        backend.unload()


def test_a_worker_memory_bound_comes_from_config_pbtxt_and_must_be_a_number(
    tmp_path: Path,
) -> None:
    bound = 'parameters { key: "DLSCALE_MAX_WORKER_MEMORY_MB" value: { string_value: "512" } }'
    folder = write_triton_python_model(tmp_path, "pair", ADD_SUB, triton_config("pair") + bound)
    config, _ = load_pbtxt(folder / "config.pbtxt", "pair")
    assert (config.backend_options.model_extra or {})["max_worker_memory_mb"] == 512
    with pytest.raises(ConfigError, match=r"'backend_options\.max_worker_memory_mb'"):
        extra = {"isolation": "thread", "max_worker_memory_mb": "lots"}
        options = BackendOptions(max_batch_size=8, extra=extra, inputs=PAIR, outputs=OUTS)
        PythonBackend(folder / "1" / "model.py", options).load()
