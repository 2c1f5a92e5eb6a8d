"""Prometheus metrics of the models that stream: sequences running and waiting, and for
generative models TTFT, TPOT, prompt and generated tokens (serving/observe/tokens.py, measured
in the serving core), the engine's KV-cache use (`GenerativeBackend.engine_stats()`) and the TTFT
and TPOT objectives its `[qos]` declares (the fleet's autoscaler reads them, scale/autoscale.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dlscale.backends.generative.contract import GenerativeBackend
from dlscale.serving.manager import ModelManager
from dlscale.serving.runners import seats_of
from dlscale.serving.seats import Seats
from dlscale.serving.served import ServedVersion

_LABELS = ["model", "version"]


class StreamCollector(Collector):
    """Reads every streaming model's seats, token measures and engines at scrape time."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        versions = self.manager.served()
        served = [(v, seats) for v in versions if (seats := seats_of(v.runner)) is not None]
        running = GaugeMetricFamily(
            "dlscale_sequences_running",
            "Requests of a model that streams holding a sequence slot now (at most max_num_seqs)",
            labels=_LABELS,
        )
        waiting = GaugeMetricFamily(
            "dlscale_sequences_waiting",
            "Requests of a model that streams waiting for a sequence slot now",
            labels=_LABELS,
        )
        for v, seats in served:
            running.add_metric([v.stats.name, v.stats.version], seats.running)
            waiting.add_metric([v.stats.name, v.stats.version], seats.waiting)
        yield running
        yield waiting
        yield from _tokens([(v, seats) for v, seats in served if seats.generative])


def _tokens(served: list[tuple[ServedVersion, Seats]]) -> Iterator[Metric]:
    ttft = HistogramMetricFamily(
        "dlscale_time_to_first_token_seconds",
        "From a generative request's arrival (its wait for a slot included) to its first token",
        labels=_LABELS,
    )
    tpot = HistogramMetricFamily(
        "dlscale_time_per_output_token_seconds",
        "Time per generated token after the first, per request",
        labels=_LABELS,
    )
    # Named with `_total` as given: the exposition types a counter that has no samples yet by
    # its family's name (serving/metrics/exposition.py).
    prompt = Metric(
        "dlscale_prompt_tokens_total", "Prompt tokens of generative requests", "counter"
    )
    generated = Metric("dlscale_generation_tokens_total", "Tokens generated", "counter")
    kv_cache = GaugeMetricFamily(
        "dlscale_kv_cache_usage_ratio",
        "Share of the engine's KV cache in use (0 to 1; the mean over its instances)",
        labels=_LABELS,
    )
    cached = GaugeMetricFamily(
        "dlscale_kv_cache_cached_ratio",
        "Share of the engine's KV cache kept for prefix matches that no sequence holds (free to "
        "evict; the mean over its instances)",
        labels=_LABELS,
    )
    objectives = {
        name: GaugeMetricFamily(
            f"dlscale_qos_{name}_objective_seconds",
            f"The p99 {name.upper()} objective of a generative model ([qos] {name}_objective_us)",
            labels=_LABELS,
        )
        for name in ("ttft", "tpot")
    }
    for v, seats in served:
        labels, tokens = [v.stats.name, v.stats.version], seats.tokens
        qos = v.config.qos  # declared whether or not the model shares a device scheduler
        if qos is not None and qos.ttft_objective_us:
            objectives["ttft"].add_metric(labels, qos.ttft_objective_us / 1e6)
        if qos is not None and qos.tpot_objective_us:
            objectives["tpot"].add_metric(labels, qos.tpot_objective_us / 1e6)
        ttft.add_metric(labels, tokens.ttft.cumulative(), tokens.ttft.total)
        tpot.add_metric(labels, tokens.tpot.cumulative(), tokens.tpot.total)
        named = dict(zip(_LABELS, labels, strict=True))
        prompt.add_sample(prompt.name, named, tokens.prompt_tokens)
        generated.add_sample(generated.name, named, tokens.generated_tokens)
        engines = [i.backend for i in v.instances if isinstance(i.backend, GenerativeBackend)]
        if engines:
            stats = [e.engine_stats() for e in engines]
            kv_cache.add_metric(labels, sum(s.kv_cache_usage for s in stats) / len(stats))
            cached.add_metric(labels, sum(s.kv_cache_cached for s in stats) / len(stats))
    yield from (ttft, tpot, *objectives.values(), prompt, generated, kv_cache, cached)
