"""vLLM's metric names on a dlscale server (issue 37 item 5): after known generative traffic
(the real `openai` client and a client that leaves mid-stream), the REST port's /metrics and
the metrics port both export `vllm:*` with `model_name`, each counting what vLLM's counts:
tokens, requests by finish reason, one inter-token gap per token after the first (not one per
request), one queue / prefill / decode / end-to-end time per finished request."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tests.toolkit.generative import next_outcome, outcomes, write_colours
from tests.toolkit.server import LocalServer, serving

MODEL = "colours"
#: (prompt, max_tokens, stop): answered in full, 4 + 6 + 3 tokens for 2 + 3 + 1 prompt words.
ASKED = (("red green", 4, None), ("one two three", 6, None), ("go", 8, "cyan"))
LABEL = {"model_name": MODEL}
PHASES = (
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:time_to_first_token_seconds",
)
Series = dict[str, list[Sample]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("repo")
    write_colours(root)
    with serving(root, grpc_port=None, metrics_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def traffic(server: LocalServer) -> dict[str, int]:
    """Sends the known requests; what they generated and why each ended."""
    generated, reasons = 0, {"length": 0, "stop": 0}
    with openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        for prompt, max_tokens, stop in ASKED:
            stream = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, stop=stop, stream=True,
                temperature=0, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = list(stream)
            usage = chunks[-1].usage
            assert usage is not None
            generated += usage.completion_tokens
            ends = [c.choices[0].finish_reason for c in chunks if c.choices]
            reasons[str(ends[-1])] += 1
    # A client that leaves after its first token: vLLM counts the request as aborted.
    before = outcomes(server.http_url, MODEL)
    body = {"text_input": "forever and ever", "parameters": {"max_tokens": 50}}
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=60) as answer:
        next(line for line in answer.iter_lines() if line.startswith("data:"))
    assert next_outcome(server.http_url, MODEL, before) == (0, 1)
    return {"generated": generated, **reasons}


def _scrape(url: str) -> Series:
    text = httpx.get(url, timeout=10).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module", params=["rest", "metrics"])
def scrape(request: pytest.FixtureRequest, server: LocalServer, traffic: dict[str, int]) -> Series:
    port = server.server.ports["http" if request.param == "rest" else "metrics"]
    return _scrape(f"http://127.0.0.1:{port}/metrics")


def _value(series: Series, family: str, sample: str, **labels: str) -> float:
    found = [s.value for s in series[family] if s.name == sample and s.labels == labels]
    assert len(found) == 1, (sample, labels, series.get(family))
    return found[0]


def test_tokens_and_requests_are_counted_by_finish_reason(
    scrape: Series, traffic: dict[str, int]
) -> None:
    prompt_words = sum(len(p.split()) for p, _, _ in ASKED) + 3
    assert _value(scrape, "vllm:prompt_tokens", "vllm:prompt_tokens_total", **LABEL) == prompt_words
    generated = _value(scrape, "vllm:generation_tokens", "vllm:generation_tokens_total", **LABEL)
    assert generated > traffic["generated"]  # the stream that was left generated some too
    for reason in ("length", "stop"):
        assert traffic[reason] > 0
        count = _value(
            scrape, "vllm:request_success", "vllm:request_success_total", **LABEL,
            finished_reason=reason,
        )  # fmt: skip
        assert count == traffic[reason]
    aborted = _value(
        scrape, "vllm:request_success", "vllm:request_success_total", **LABEL,
        finished_reason="abort",
    )  # fmt: skip
    assert aborted == 1


def test_the_inter_token_latency_is_observed_per_token(
    scrape: Series, traffic: dict[str, int]
) -> None:
    family = "vllm:inter_token_latency_seconds"
    count = _value(scrape, family, family + "_count", **LABEL)
    generated = _value(scrape, "vllm:generation_tokens", "vllm:generation_tokens_total", **LABEL)
    requests = len(ASKED) + 1
    # One observation per token after each request's first, however many requests there were.
    assert count == generated - requests
    assert _value(scrape, family, family + "_bucket", **LABEL, le="+Inf") == count
    assert _value(scrape, family, family + "_sum", **LABEL) > 0


def test_each_finished_request_has_its_phases(scrape: Series, traffic: dict[str, int]) -> None:
    for family in PHASES[:4]:  # vLLM times the requests that finish
        assert _value(scrape, family, family + "_count", **LABEL) == len(ASKED), family
    ttft = "vllm:time_to_first_token_seconds"
    assert _value(scrape, ttft, ttft + "_count", **LABEL) == len(ASKED) + 1
    whole = _value(scrape, PHASES[0], PHASES[0] + "_sum", **LABEL)
    parts = sum(_value(scrape, f, f + "_sum", **LABEL) for f in PHASES[1:4])
    assert 0 < parts <= whole or math.isclose(parts, whole)


def test_gauges_say_the_server_is_idle(scrape: Series) -> None:
    assert _value(scrape, "vllm:num_requests_running", "vllm:num_requests_running", **LABEL) == 0
    assert _value(scrape, "vllm:num_requests_waiting", "vllm:num_requests_waiting", **LABEL) == 0
    # A Python model is no engine: no KV cache to report, and no prefix-cache counters.
    assert scrape["vllm:kv_cache_usage_perc"] == []
    assert scrape["vllm:prefix_cache_queries"] == []


def test_the_rest_port_metrics_need_the_key_as_statistics_do(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("keyed")
    write_colours(root)
    with serving(root, grpc_port=None, api_key="k") as running:
        url = f"http://{running.http_url}/metrics"
        assert httpx.get(url, timeout=10).status_code == 401
        answer = httpx.get(url, headers={"authorization": "Bearer k"}, timeout=10)
        assert answer.status_code == 200
        assert "vllm:num_requests_running" in answer.text
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
