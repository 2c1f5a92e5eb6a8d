"""Pipelines as a Triton user meets ensembles: a repository with config.pbtxt ensembles and
config.toml pipelines, used with tritonclient over REST and gRPC exactly as against Triton."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.pipelines import (
    diamond,
    pipeline_repository,
    pipeline_toml,
    step,
    write_pipeline,
)
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

X = np.arange(12, dtype=np.float32).reshape(3, 4)
PIPELINES = ("breaks", "chain", "diamond", "urgent")
STEPS = ("add_one", "copy", "double", "evens", "join", "slow")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pipeline_repository(tmp_path_factory.mktemp("pipelines"))


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with serving(root) as running:
        yield running


Client = th.InferenceServerClient | tg.InferenceServerClient


def _infer(client: Client, model: str, inputs: dict[str, np.ndarray], **kw: Any) -> Any:
    module: Any = th if isinstance(client, th.InferenceServerClient) else tg
    wire = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), module.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        wire.append(tensor)
    return client.infer(model, wire, **kw)


def test_pipelines_are_models_in_the_index_and_metadata(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    states = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert all(states[n] == "READY" for n in (*PIPELINES, *STEPS))
    assert http.is_server_ready() and grpc.is_model_ready("chain")
    assert http.get_model_metadata("chain")["platform"] == "ensemble"
    assert grpc.get_model_metadata("diamond").platform == "ensemble"


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_chain_and_a_diamond_answer_as_their_steps_compute(
    kind: str, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    client: Client = http if kind == "http" else grpc
    chained = _infer(client, "chain", {"RAW": X})
    np.testing.assert_array_equal(chained.as_numpy("RESULT"), X + 1)
    joined = _infer(client, "diamond", {"RAW": X})
    for name, expected in diamond(X).items():
        np.testing.assert_array_equal(joined.as_numpy(name), expected)


def test_the_config_shows_the_ensemble_scheduling(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    config = http.get_model_config("chain")
    assert config["platform"] == "ensemble" and config["backend"] == ""
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["model_version"]) for s in steps] == [
        ("add_one", -1),
        ("copy", -1),
    ]
    assert steps[0]["input_map"] == {"INPUT0": "RAW"}
    message = grpc.get_model_config("diamond").config
    assert message.platform == "ensemble"
    assert [s.model_name for s in message.ensemble_scheduling.step] == [
        "add_one",
        "double",
        "copy",
        "join",
    ]
    assert dict(message.ensemble_scheduling.step[3].output_map) == {"sum": "SUM", "diff": "DIFF"}


def test_a_failing_step_is_named_with_its_own_status(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match=r"step 2 \(model 'evens'\)") as rest:
        _infer(http, "breaks", {"x": X[:2]})
    assert rest.value.status() == "500"
    with pytest.raises(InferenceServerException, match=r"step 2 \(model 'evens'\)") as remote:
        _infer(grpc, "breaks", {"x": X[:2]})
    assert remote.value.status() == "StatusCode.INTERNAL"
    # The client's row, accepted by the pipeline and refused by its first step: a 4xx.
    with pytest.raises(InferenceServerException, match=r"step 1 \(model 'add_one'\)") as rest:
        _infer(http, "chain", {"RAW": X[:, :3]})
    assert rest.value.status() == "400"
    with pytest.raises(InferenceServerException, match="add_one") as remote:
        _infer(grpc, "chain", {"RAW": X[:, :3]})
    assert remote.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert _infer(http, "breaks", {"x": X}).as_numpy("y").shape == (3, 4)  # still serving


def test_malformed_inputs_get_400_and_the_good_requests_beside_them_all_succeed(
    http: th.InferenceServerClient,
) -> None:
    good = [X + i for i in range(8)]
    sent = []
    for i in range(16):  # interleaved, all in flight at once (the client's pool of 8)
        array = good[i // 2] if i % 2 else good[i // 2].astype(np.int32)
        tensor = th.InferInput("RAW", list(array.shape), "FP32" if i % 2 else "INT32")
        tensor.set_data_from_numpy(array)
        sent.append(http.async_infer("diamond", [tensor]))
    for i, pending in enumerate(sent):
        if i % 2:
            answer = pending.get_result()
            np.testing.assert_array_equal(answer.as_numpy("SUM"), diamond(good[i // 2])["SUM"])
            continue
        with pytest.raises(InferenceServerException, match="datatype") as refused:
            pending.get_result()
        assert refused.value.status() == "400" and "'diamond'" in str(refused.value)


def test_a_deadline_that_expires_in_the_second_steps_queue_is_a_timeout(
    server: LocalServer, grpc: tg.InferenceServerClient
) -> None:
    # "slow" computes one row at a time: the pipeline's second step queues behind this one,
    # once it computes (sent and not yet taken, it could follow the pipeline's request).
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(_infer, grpc, "slow", {"INPUT0": X[:1]})  # thread-safe
        server.until_computing("slow")
        with pytest.raises(InferenceServerException, match=r"step 2 \(model 'slow'\)") as remote:
            _infer(grpc, "urgent", {"x": X[:1]}, timeout=100_000)
        assert remote.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert "timed out in the queue" in str(remote.value)
        busy.result()


def test_statistics_count_the_pipeline_and_each_step(http: th.InferenceServerClient) -> None:
    before = _successes(http, "copy")
    pipeline_before = _successes(http, "chain")
    _infer(http, "chain", {"RAW": X})
    assert _successes(http, "copy") == before + 1
    assert _successes(http, "chain") == pipeline_before + 1


def _successes(client: th.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def test_a_used_step_cannot_be_unloaded_and_a_missing_one_refuses_the_load(
    root: Path, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match=r"pipelines \['breaks', 'chain'") as rest:
        http.unload_model("add_one")
    assert rest.value.status() == "400"
    assert grpc.is_model_ready("add_one")
    lonely = [step("absent", {"INPUT0": "x"}, {"OUTPUT0": "y"})]
    write_pipeline(root, "orphan", pipeline_toml(0, ["x"], ["y"], lonely))
    with pytest.raises(InferenceServerException, match="'absent'") as rest:
        http.load_model("orphan")
    assert rest.value.status() == "400"
    assert not http.is_model_ready("orphan")
    row = next(m for m in http.get_model_repository_index() if m["name"] == "orphan")
    assert row["state"] == "UNAVAILABLE" and "'absent'" in row["reason"]
    assert http.is_server_ready()  # never loaded, so never required
