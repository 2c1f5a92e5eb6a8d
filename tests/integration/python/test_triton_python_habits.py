"""A Triton Python-backend user's habits against a real server, with tritonclient: BLS as
Triton's examples write it (the callee's name read from a BYTES tensor, `exec(decoupled=True)`,
`async_exec`), custom metrics (pb_utils.MetricFamily) from a worker process on /metrics,
`auto_complete_config`, and errors that name what exists (did you mean ...)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.python_models import write_triton_python_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

#: Triton's add_sub example, no batching, 16 floats: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = -.
ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out_0 = pb_utils.Tensor("OUTPUT0", in_0 + in_1)
            out_1 = pb_utils.Tensor("OUTPUT1", in_0 - in_1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses
"""

#: Written in the style of Triton's BLS sync example (the model to call comes in MODEL_NAME,
#: read with `as_numpy()[0]`: bytes), plus its custom-metrics example's counter and histogram.
BLS_SYNC = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = pb_utils.MetricFamily(
            name="bls_requests", description="BLS requests made",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels=labels)
        self.latency = pb_utils.MetricFamily(
            name="bls_latency_seconds", description="BLS round trips",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        ).Metric(labels=labels, buckets=[0.001, 0.01, 0.1, 1.0, 10.0])
        self.inflight = pb_utils.MetricFamily(
            "bls_last_size", "Elements of the last input", pb_utils.MetricFamily.GAUGE
        ).Metric(labels=labels)

    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            model_name_string = model_name.as_numpy()[0]
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name_string,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
            )
            start = time.perf_counter()
            if self.model_config["parameters"].get("STREAMED"):
                infer_response = next(iter(infer_request.exec(decoupled=True)))
            else:
                infer_response = infer_request.exec()
            self.latency.observe(time.perf_counter() - start)
            self.requests.increment(1)
            self.inflight.set(float(in_0.as_numpy().size))
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            out_0 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0")
            out_1 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out_0.as_numpy()),
                pb_utils.Tensor("OUTPUT1", out_1.as_numpy()),
            ]))
        return responses
"""

#: Triton's BLS async example's shape: `async def execute` awaiting two `async_exec` calls.
BLS_ASYNC = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name, requested_output_names=[output], inputs=inputs
                ).async_exec()
                for name, output in (("add_sub", "OUTPUT0"), (b"add_sub", "OUTPUT1"))
            ]
            added, taken = await asyncio.gather(*calls)
            for answer in (added, taken):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", added.output_tensors()[0].as_numpy()),
                pb_utils.Tensor("OUTPUT1", taken.output_tensors()[0].as_numpy()),
            ]))
        return responses
"""

#: A model whose config.pbtxt says only its backend: `auto_complete_config` gives the rest.
AUTO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(8)
        fp32 = {"data_type": "TYPE_FP32", "dims": [4]}
        auto_complete_model_config.add_input({"name": "IN", **fp32})
        auto_complete_model_config.add_output({"name": "OUT", **fp32})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2
            )])
            for r in requests
        ]
"""

#: The same, streaming: `set_model_transaction_policy` makes it decoupled.
AUTO_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "N", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "I", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_model_transaction_policy(dict(decoupled=True))
        return config

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                out = pb_utils.Tensor("I", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

#: Decoupled BLS: exec(decoupled=True) to auto_stream, its responses summed and counted.
BLS_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            call = pb_utils.InferenceRequest(
                model_name="auto_stream", requested_output_names=["I"], inputs=[n]
            )
            seen = []
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = pb_utils.get_output_tensor_by_name(answer, "I")
                if out is not None:  # Triton's last response may be empty
                    seen.append(int(out.as_numpy()[0]))
            summary = np.array([sum(seen), len(seen)], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", summary)]))
        return responses
"""
BLS_STREAM_CONFIG = """
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""

#: A model whose initialize makes series until the bound stops it (a label per request id is
#: the classic mistake); execute answers what the bound said.
FLOOD = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily("flood_series", "One per id", pb_utils.MetricFamily.GAUGE)
        self.refused = "nothing refused"
        for i in range(1100):
            try:
                family.Metric(labels={"id": str(i)}).set(i)
            except pb_utils.TritonModelException as exc:
                self.refused = str(exc)
                break

    def execute(self, requests):
        said = np.array([self.refused.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REFUSED", said)]) for _ in requests]
"""
FLOOD_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "REFUSED" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "DLSCALE_ISOLATION" value: { string_value: "thread" } }
"""

TENSORS = """
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}{more}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""
NAME_INPUT = ',\n  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }'
THREAD = 'parameters { key: "DLSCALE_ISOLATION" value: { string_value: "thread" } }\n'
STREAMED = 'parameters { key: "STREAMED" value: { string_value: "yes" } }\n'
LOADED = ("add_sub", "bls_sync", "bls_streamed", "bls_async", "auto", "auto_stream", "flood",
          "bls_stream", "bls_stream_inline")  # fmt: skip
#: auto_complete_config that contradicts its config.pbtxt (max_batch_size 4 there, 8 in AUTO).
CLASH_CONFIG = 'backend: "python"\nmax_batch_size: 4\n' + THREAD

A = np.arange(16, dtype=np.float32)
B = np.full(16, 2.0, np.float32)


def _config(name: str, more: str = "", extra: str = "") -> str:
    head = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
    return head + TENSORS.format(more=more) + extra


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("habits")
    for name in ("add_sub", "resting"):  # resting: in the repository, not loaded
        write_triton_python_model(root, name, ADD_SUB, _config(name, extra=THREAD))
    # bls_sync in a worker process, as Triton runs a Python model: its metrics cross over.
    write_triton_python_model(root, "bls_sync", BLS_SYNC, _config("bls_sync", NAME_INPUT))
    streamed = _config("bls_streamed", NAME_INPUT, THREAD + STREAMED)
    write_triton_python_model(root, "bls_streamed", BLS_SYNC, streamed)
    write_triton_python_model(root, "bls_async", BLS_ASYNC, _config("bls_async", extra=THREAD))
    write_triton_python_model(root, "auto", AUTO, 'backend: "python"\n' + THREAD)
    write_triton_python_model(root, "auto_stream", AUTO_STREAM, 'backend: "python"\n' + THREAD)
    write_triton_python_model(root, "flood", FLOOD, FLOOD_CONFIG)
    write_triton_python_model(root, "bls_stream", BLS_STREAM, BLS_STREAM_CONFIG)  # a worker
    write_triton_python_model(root, "bls_stream_inline", BLS_STREAM, BLS_STREAM_CONFIG + THREAD)
    write_triton_python_model(root, "auto_clash", AUTO, CLASH_CONFIG)
    with serving(root, load_models=LOADED, metrics_port=0) as running:
        yield running


def _inputs(module: object, callee: bytes | None) -> list[object]:
    arrays = {"INPUT0": A, "INPUT1": B}
    if callee is not None:
        arrays["MODEL_NAME"] = np.array([callee], dtype=object)
    made = []
    for name, array in arrays.items():
        one = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))  # type: ignore[attr-defined]
        one.set_data_from_numpy(array)
        made.append(one)
    return made


def test_bls_with_the_callee_named_in_a_bytes_tensor(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    for model in ("bls_sync", "bls_streamed"):  # exec() and exec(decoupled=True)
        answer = http.infer(model, _inputs(th, b"add_sub"))
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), A - B)
        over_grpc = grpc.infer(model, _inputs(tg, b"add_sub"))
        np.testing.assert_array_equal(over_grpc.as_numpy("OUTPUT1"), A - B)


def test_async_exec_from_an_async_execute(grpc: tg.InferenceServerClient) -> None:
    answer = grpc.infer("bls_async", _inputs(tg, None))
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), A - B)


def test_bls_to_a_model_not_loaded_or_misspelt_says_so(http: th.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as resting:
        http.infer("bls_sync", _inputs(th, b"resting"))
    assert "'resting' is in the repository but not loaded" in str(resting.value)
    with pytest.raises(InferenceServerException) as misspelt:
        http.infer("bls_sync", _inputs(th, b"add_sbu"))
    assert "unknown model 'add_sbu' (did you mean 'add_sub'?" in str(misspelt.value)
    assert "b'add_sbu'" not in str(misspelt.value)
    http.infer("bls_sync", _inputs(th, b"add_sub"))  # still serving


def test_unknown_names_get_the_closest_and_the_list(
    server: LocalServer, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    for client, module in ((http, th), (grpc, tg)):
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("add_sbu", _inputs(module, None))
        text = str(unknown.value)
        assert "did you mean 'add_sub'?" in text and "loaded: 'add_sub', 'auto'" in text, text
        with pytest.raises(InferenceServerException) as resting:
            client.infer("resting", _inputs(module, None))
        assert "in the repository but not loaded" in str(resting.value)
        misspelt = _inputs(module, None)
        misspelt[1] = module.InferInput("INPUT_1", [16], "FP32")  # type: ignore[attr-defined]
        misspelt[1].set_data_from_numpy(B)  # type: ignore[attr-defined]
        with pytest.raises(InferenceServerException) as wrong_input:
            client.infer("add_sub", misspelt)
        assert "sent 'INPUT_1' (did you mean 'INPUT1'?)" in str(wrong_input.value)
    with pytest.raises(InferenceServerException) as load:
        grpc.load_model("add_sbu")
    assert "no model 'add_sbu' in the repository (did you mean 'add_sub'? it has:" in str(
        load.value
    )
    url = f"http://{server.http_url}/v2/models/add_sbu/infer"
    assert httpx.post(url, json={"inputs": []}).status_code == 404


def test_custom_metrics_from_a_worker_process_reach_metrics(
    server: LocalServer, http: th.InferenceServerClient
) -> None:
    for _ in range(3):
        http.infer("bls_sync", _inputs(th, b"add_sub"))
    text = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics").text
    labels = '{model="bls_sync",version="1"}'
    counted = _value(text, f"bls_requests{labels}")
    assert counted >= 3, text
    assert "# TYPE bls_requests counter" in text
    assert "# TYPE bls_latency_seconds histogram" in text
    assert _value(text, f"bls_latency_seconds_count{labels}") == counted
    assert (
        _value(text, 'bls_latency_seconds_bucket{le="+Inf",model="bls_sync",version="1"}')
        == counted
    )
    assert _value(text, f"bls_last_size{labels}") == 16.0


def _value(text: str, series: str) -> float:
    line = next((ln for ln in text.splitlines() if ln.startswith(series + " ")), None)
    assert line is not None, f"{series} not in /metrics"
    return float(line.rsplit(" ", 1)[1])


def test_auto_complete_config_completes_the_config(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    config = http.get_model_config("auto")
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [("IN", "TYPE_FP32")]
    x = np.ones((3, 4), np.float32)
    inp = th.InferInput("IN", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("auto", [inp]).as_numpy("OUT"), x * 2)
    assert grpc.get_model_config("auto_stream").config.model_transaction_policy.decoupled


def test_an_auto_completed_decoupled_model_streams(grpc: tg.InferenceServerClient) -> None:
    got: list[object] = []
    grpc.start_stream(callback=lambda result, error: got.append(error or result))
    try:
        n = tg.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([3], np.int32))
        grpc.async_stream_infer("auto_stream", [n], enable_empty_final_response=True)
    finally:
        grpc.stop_stream()  # waits for the stream's end
    values = [int(r.as_numpy("I")[0]) for r in got if r.as_numpy("I") is not None]  # type: ignore[union-attr]
    assert values == [0, 1, 2], got


def test_auto_complete_config_that_contradicts_the_config_fails_the_load(
    http: th.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        http.load_model("auto_clash")
    said = str(refused.value)
    assert "auto_complete_config failed" in said
    assert "set_max_batch_size(8): the config sets max_batch_size 4" in said
    assert not http.is_model_ready("auto_clash") and http.is_server_live()


def _flood_series(server: LocalServer) -> int:
    text = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics").text
    return sum(1 for line in text.splitlines() if line.startswith("flood_series{"))


def test_a_model_cannot_grow_metrics_past_its_bound(
    server: LocalServer, grpc: tg.InferenceServerClient
) -> None:
    x = tg.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    refused = grpc.infer("flood", [x]).as_numpy("REFUSED")[0].decode()
    assert "has 1000 metric series (label sets), the most one model may have" in refused
    assert _flood_series(server) == 1000
    grpc.load_model("flood")  # a reload: the new copy's series stay, the old copy's go
    assert _flood_series(server) == 1000
    grpc.unload_model("flood")  # the last copy: its series leave /metrics
    assert _flood_series(server) == 0


@pytest.mark.parametrize("model", ["bls_stream", "bls_stream_inline"])
def test_decoupled_bls_iterates_a_streaming_models_responses(
    grpc: tg.InferenceServerClient, model: str
) -> None:
    n = tg.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([4], np.int32))
    total, count = grpc.infer(model, [n]).as_numpy("SEEN")
    assert (total, count) == (0 + 1 + 2 + 3, 4)
