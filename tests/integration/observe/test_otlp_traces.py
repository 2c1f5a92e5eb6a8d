"""OTLP traces against a real receiver (tests/toolkit/otlp.py): the span tree of a pipeline
request over REST, of a gRPC request, of a generative request over the OpenAI API; the caller's
W3C `traceparent` continued; sampling by the trace rate; a failed request marked; and with the
collector down, requests still answered and the queue of spans bounded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.generative import write_colours
from tests.toolkit.models import add_graph, identity_graph, save_onnx
from tests.toolkit.otlp import ReceivedSpan, Receiver, receiving, receiving_grpc
from tests.toolkit.pipelines import CHAIN_PBTXT, STEP_BATCH, write_pipeline
from tests.toolkit.python_models import (
    ADD_SUB,
    BLS,
    triton_config,
    write_triton_python_model,
)
from tests.toolkit.server import LocalServer, free_port, serving
from tritonclient.utils import InferenceServerException

from dlscale.errors import ConfigError
from dlscale.serving.observe.otel import OtlpSink, traces_url

_STEP = """max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""
PHASES = ["queue", "batch formation", "compute", "batch split"]


def _repository(folder: Path) -> None:
    save_onnx(add_graph(1.0, 4, "INPUT0", "OUTPUT0"), folder / "add_one" / "1" / "model.onnx")
    (folder / "add_one" / "config.pbtxt").write_text(_STEP.format(mbs=STEP_BATCH))
    save_onnx(identity_graph(4, "INPUT0", "OUTPUT0"), folder / "copy" / "1" / "model.onnx")
    (folder / "copy" / "config.pbtxt").write_text(_STEP.format(mbs=STEP_BATCH))
    write_pipeline(folder, "chain", CHAIN_PBTXT, "config.pbtxt")
    write_colours(folder)
    # Triton's BLS: `bls` calls `add_sub` from its execute (both in the server's process).
    add_sub = triton_config("add_sub", isolation="thread")
    write_triton_python_model(folder, "add_sub", ADD_SUB, add_sub)
    bls = triton_config("bls", outputs=(), isolation="thread")
    write_triton_python_model(folder, "bls", BLS, bls)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with receiving() as running:
        yield running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("otlp")
    _repository(root)
    with serving(root, otlp_traces_endpoint=receiver.endpoint, trace_rate=1) as running:
        yield running


def _parent(trace: str, span: str) -> str:
    return f"00-{trace}-{span}-01"


def _spans(
    server: LocalServer, receiver: Receiver, trace: str, roots: int = 1
) -> list[ReceivedSpan]:
    """The trace's spans once its `roots` request spans have arrived (flushed; bounded wait)."""
    sink = server.dataplane.tracer.otlp
    assert sink is not None
    for _ in range(200):
        sink.flush()
        spans = receiver.trace(trace)
        if sum(s.name == "request" for s in spans) >= roots:
            return spans
        time.sleep(0.05)
    raise AssertionError(f"trace {trace} never reached the receiver: {receiver.spans}")


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start)


def _within(child: ReceivedSpan, parent: ReceivedSpan) -> bool:
    return parent.start <= child.start <= child.end <= parent.end


def test_a_pipeline_request_over_rest_continues_the_callers_trace(
    server: LocalServer, receiver: Receiver
) -> None:
    trace, caller = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    client = httpclient.InferenceServerClient(server.http_url)
    raw = httpclient.InferInput("RAW", [1, 4], "FP32")
    raw.set_data_from_numpy(np.ones((1, 4), np.float32))
    result = client.infer("chain", [raw], headers={"traceparent": _parent(trace, caller)})
    assert np.allclose(result.as_numpy("RESULT"), 2.0)

    spans = _spans(server, receiver, trace)
    [root] = [s for s in spans if s.name == "request"]
    assert root.parent_id == caller  # the caller's span is the parent: its trace continues
    assert root.attributes["model"] == "chain" and not root.error
    steps = [s for s in _children(spans, root) if s.name == "pipeline step"]
    assert [s.attributes["model"] for s in steps] == ["add_one", "copy"]
    for step in steps:
        assert _within(step, root)
        phases = _children(spans, step)
        assert [p.name for p in phases] == PHASES
        assert all(_within(p, step) for p in phases)
        compute = phases[2]
        assert compute.attributes["batch_size"] == 1


def test_a_grpc_request_continues_the_trace_of_its_metadata(
    server: LocalServer, receiver: Receiver
) -> None:
    trace, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    x.set_data_from_numpy(np.zeros((2, 4), np.float32))
    client.infer("add_one", [x], headers={"traceparent": _parent(trace, caller)})
    client.close()

    spans = _spans(server, receiver, trace)
    [root] = [s for s in spans if s.name == "request"]
    assert root.parent_id == caller and root.attributes["model"] == "add_one"
    phases = _children(spans, root)
    assert [p.name for p in phases] == PHASES
    assert phases[2].attributes["batch_size"] == 2


def test_a_bls_call_is_a_child_of_the_request_whose_batch_made_it(
    server: LocalServer, receiver: Receiver
) -> None:
    trace, caller = "7d1e7a5f8a3c4b2e9f0a1b2c3d4e5f60", "a1a2a3a4a5a6a7a8"
    client = httpclient.InferenceServerClient(server.http_url)
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        tensors.append(tensor)
    result = client.infer("bls", tensors, headers={"traceparent": _parent(trace, caller)})
    assert np.allclose(result.as_numpy("OUTPUT0"), 4.0)

    spans = _spans(server, receiver, trace)
    [root] = [s for s in spans if s.name == "request"]
    assert root.parent_id == caller and root.attributes["model"] == "bls"
    children = _children(spans, root)
    [call] = [s for s in children if s.name == "model call"]
    assert call.attributes["model"] == "add_sub"
    [compute] = [s for s in children if s.name == "compute"]
    assert _within(call, compute)  # made by the model while its batch computed
    assert [p.name for p in _children(spans, call)] == PHASES


def test_a_generative_request_has_prefill_and_decode(
    server: LocalServer, receiver: Receiver
) -> None:
    trace, caller = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    with openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        chunks = list(
            client.completions.create(
                model="colours", prompt="red green", max_tokens=5, stream=True,
                extra_headers={"traceparent": _parent(trace, caller)},
            )
        )  # fmt: skip
    assert chunks

    spans = _spans(server, receiver, trace)
    [root] = [s for s in spans if s.name == "request"]
    assert root.parent_id == caller and root.attributes["model"] == "colours"
    queue, prefill, decode = _children(spans, root)
    assert (queue.name, prefill.name, decode.name) == ("queue", "prefill", "decode")
    assert queue.end == prefill.start and prefill.end == decode.start
    assert all(_within(p, root) for p in (queue, prefill, decode))


def test_requests_are_sampled_by_the_trace_rate(server: LocalServer, receiver: Receiver) -> None:
    url = f"http://{server.http_url}/v2/trace/setting"
    assert httpx.post(url, json={"trace_rate": "4"}).json()["trace_mode"] == "opentelemetry"
    try:
        receiver.clear()
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        for _ in range(8):
            client.infer("add_one", [x])
        sink = server.dataplane.tracer.otlp
        assert sink is not None and sink.flush()
        roots = [s for s in receiver.spans if s.name == "request"]
        assert len(roots) == 2  # one in four
        assert len({s.trace_id for s in roots}) == 2  # each a new trace
    finally:
        httpx.post(url, json={"trace_rate": "1"})


def test_a_trace_count_stops_tracing_after_that_many(
    server: LocalServer, receiver: Receiver
) -> None:
    url = f"http://{server.http_url}/v2/models/add_one/trace/setting"
    httpx.post(url, json={"trace_count": "2", "trace_rate": "1"}).raise_for_status()
    try:
        receiver.clear()
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        for _ in range(5):
            client.infer("add_one", [x])
        sink = server.dataplane.tracer.otlp
        assert sink is not None and sink.flush()
        assert sum(s.name == "request" for s in receiver.spans) == 2
        assert httpx.get(url).json()["trace_count"] == "0"
    finally:
        httpx.post(url, json={"trace_count": None, "trace_rate": None})


def test_a_failed_request_is_marked_as_an_error(server: LocalServer, receiver: Receiver) -> None:
    trace = "6e0c63257de34c926f9efcd03899a5a2"
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("add_one", [x], headers={"traceparent": _parent(trace, "1" * 16)})
    [root] = [s for s in _spans(server, receiver, trace) if s.name == "request"]
    assert root.error


def test_with_the_collector_down_requests_are_answered(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("down")
    _repository(root)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with serving(root, otlp_traces_endpoint=endpoint, trace_rate=1) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        for _ in range(20):
            assert np.allclose(client.infer("add_one", [x]).as_numpy("OUTPUT0"), 1.0)


def test_the_span_queue_is_bounded_while_the_collector_is_down() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from dlscale.serving.observe.stats import RequestTimes

    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    sink = OtlpSink(endpoint, queue_size=16, exporter=OTLPSpanExporter(endpoint, timeout=0.5))
    try:
        for _ in range(300):  # 1,500 spans: each request writes its own and four phases
            now = time.perf_counter_ns()
            span = sink.begin("request", {"model": "m"}, "", now)
            times = RequestTimes(now, now, now + 1, now + 2, now + 3, now + 4, now + 5, 1)
            sink.end(span, times, None, True)
            assert sink.queued() <= 16
        assert sink.drops.count > 0  # dropped, counted, warned of once
    finally:
        sink.shutdown(wait_s=0.5)


def test_a_grpc_collector_gets_the_spans(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("grpc-collector")
    _repository(root)
    trace, caller = "8a3c60f7d188f8fa79d48a391a778fa6", "53995c3f42cd8ad8"
    with (
        receiving_grpc() as receiver,
        serving(root, otlp_traces_endpoint=receiver.endpoint, trace_rate=1) as running,
    ):
        client = httpclient.InferenceServerClient(running.http_url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        client.infer("add_one", [x], headers={"traceparent": _parent(trace, caller)})
        spans = _spans(running, receiver, trace)
    [root_span] = [s for s in spans if s.name == "request"]
    assert root_span.parent_id == caller
    assert [p.name for p in _children(spans, root_span)] == PHASES


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("https://c.example/otlp/v1/traces", "https://c.example/otlp/v1/traces"),
        ("grpc://collector:4317", "grpc://collector:4317"),
    ],
)
def test_endpoints_name_the_collector_as_otlp_names_it(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["ftp://collector:21", "http://", "grpc:///x"])
def test_a_bad_endpoint_is_refused_at_start(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="OTLP traces endpoint"):
        traces_url(endpoint)
