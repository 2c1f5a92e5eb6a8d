"""vLLM's metric names beside dlscale's, for generative models: vLLM's Grafana dashboard reads
`vllm:*` with a `model_name` label, so it works on a dlscale server unchanged.

The values are the ones the `dlscale_*` families show (measured in the serving core,
serving/observe/tokens.py, and read from the engines); a model served in several versions is
one `model_name`, its versions summed, as vLLM serves one model per name. The names are listed
in docs/observability.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dlscale.backends.generative.contract import EngineStats, GenerativeBackend
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.stats import Histogram
from dlscale.serving.observe.tokens import TokenStats
from dlscale.serving.runners import seats_of
from dlscale.serving.seats import Seats
from dlscale.serving.served import ServedVersion

LABEL = "model_name"
#: Histograms: vLLM's name -> (help, the TokenStats histogram it reads).
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Time to first token", "ttft"),
    "vllm:inter_token_latency_seconds": ("Time between generated tokens, per token", "inter_token"),
    "vllm:e2e_request_latency_seconds": ("End-to-end request latency", "end_to_end"),
    "vllm:request_queue_time_seconds": ("Time requests waited for a sequence slot", "queue"),
    "vllm:request_prefill_time_seconds": ("Time from a slot to the first token", "prefill"),
    "vllm:request_decode_time_seconds": ("Time from the first token to the last", "decode"),
}


class _Model:
    """One generative model's versions, as vLLM's one `model_name`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seats: list[Seats] = []
        self.engines: list[EngineStats] = []

    def add(self, version: ServedVersion, seats: Seats) -> None:
        self.seats.append(seats)
        for instance in version.instances:
            if isinstance(instance.backend, GenerativeBackend):
                self.engines.append(instance.backend.engine_stats())

    @property
    def tokens(self) -> list[TokenStats]:
        return [s.tokens for s in self.seats]


class VllmCollector(Collector):
    """Reads every generative model's seats, token measures and engines at scrape time."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def _models(self) -> list[_Model]:
        models: dict[str, _Model] = {}
        for entry in self.manager.entries():
            for version in entry.versions.values():
                seats = seats_of(version.runner)
                if seats is not None and seats.generative:
                    models.setdefault(entry.name, _Model(entry.name)).add(version, seats)
        return list(models.values())

    def collect(self) -> Iterator[Metric]:
        models = self._models()
        yield from _gauges(models)
        yield from _counters(models)
        for name, (doc, field) in HISTOGRAMS.items():
            family = HistogramMetricFamily(name, doc, labels=[LABEL])
            for m in models:
                merged = _merge([getattr(t, field) for t in m.tokens])
                family.add_metric([m.name], merged.cumulative(), merged.total)
            yield family


def _gauges(models: Sequence[_Model]) -> Iterator[Metric]:
    running = GaugeMetricFamily(
        "vllm:num_requests_running", "Requests holding a sequence slot", labels=[LABEL]
    )
    waiting = GaugeMetricFamily(
        "vllm:num_requests_waiting", "Requests waiting for a sequence slot", labels=[LABEL]
    )
    kv_cache = GaugeMetricFamily(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage, 0 to 1 (1 = 100%); blocks kept only for prefix matches are free",
        labels=[LABEL],
    )
    for m in models:
        running.add_metric([m.name], sum(s.running for s in m.seats))
        waiting.add_metric([m.name], sum(s.waiting for s in m.seats))
        if m.engines:
            kv_cache.add_metric([m.name], sum(e.kv_cache_usage for e in m.engines) / len(m.engines))
    yield from (running, waiting, kv_cache)


def _counters(models: Sequence[_Model]) -> Iterator[Metric]:
    prompt = CounterMetricFamily("vllm:prompt_tokens", "Prefill tokens processed", labels=[LABEL])
    generated = CounterMetricFamily(
        "vllm:generation_tokens", "Generation tokens processed", labels=[LABEL]
    )
    success = CounterMetricFamily(
        "vllm:request_success",
        "Requests that ran to their end, by finish reason",
        labels=[LABEL, "finished_reason"],
    )
    queries = CounterMetricFamily(
        "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", labels=[LABEL]
    )
    hits = CounterMetricFamily(
        "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", labels=[LABEL]
    )
    for m in models:
        prompt.add_metric([m.name], sum(t.prompt_tokens for t in m.tokens))
        generated.add_metric([m.name], sum(t.generated_tokens for t in m.tokens))
        reasons: dict[str, int] = {}
        for t in m.tokens:
            for reason, n in t.finished_by.items():
                reasons[reason] = reasons.get(reason, 0) + n
        for reason, n in sorted(reasons.items()):
            success.add_metric([m.name, reason], n)
        # Only an engine that counts its prefix-cache lookups has these series (vLLM does).
        looked = [e for e in m.engines if e.prefix_cache_queries is not None]
        if looked:
            queries.add_metric([m.name], sum(e.prefix_cache_queries or 0 for e in looked))
            hits.add_metric([m.name], sum(e.prefix_cache_hits or 0 for e in looked))
    yield from (prompt, generated, success, queries, hits)


def _merge(histograms: Sequence[Histogram]) -> Histogram:
    if len(histograms) == 1:
        return histograms[0]
    merged = Histogram(histograms[0].bounds)
    for h in histograms:
        merged.counts = [a + b for a, b in zip(merged.counts, h.counts, strict=True)]
        merged.total += h.total
        merged.count += h.count
    return merged
