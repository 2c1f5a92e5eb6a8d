"""Prometheus metrics of model memory: each loaded version's bytes, the budget, what is resident,
loads, their times, and evictions (docs/memory.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dlscale.serving.control.demand import OnDemand
from dlscale.serving.manager import ModelManager


class MemoryCollector(Collector):
    """Reads the manager's memory ledger (and the on-demand loader, if any) at scrape time."""

    def __init__(
        self, manager: ModelManager, demand: Callable[[], OnDemand | None] = lambda: None
    ) -> None:
        self.manager = manager
        self.demand = demand

    def collect(self) -> Iterator[Metric]:
        ledger = self.manager.memory
        model = GaugeMetricFamily(
            "dlscale_model_memory_bytes",
            "Bytes a loaded model version holds on a device, measured at its load",
            labels=["model", "version", "device"],
        )
        for entry in self.manager.entries():
            for version, served in entry.versions.items():
                for device, size in served.memory.items():
                    model.add_metric([entry.name, str(version), device], size)
        yield model
        yield _by_device(
            "dlscale_memory_budget_bytes", "The memory budget of a device", ledger.budget
        )
        yield _by_device(
            "dlscale_memory_resident_bytes",
            "Bytes the loaded models hold on a device together, by their measured sizes, with "
            "those the loads in flight reserved",
            ledger.used(),
        )
        yield _by_device(
            "dlscale_model_loads_running",
            "Loads taking their turn on a device now (several at once on the host)",
            ledger.running(),
        )
        hist = ledger.load_seconds
        yield HistogramMetricFamily(
            "dlscale_model_load_seconds",
            "Time each model version took to load (and warm up)",
            buckets=hist.cumulative(),
            sum_value=hist.total,
        )
        yield from self._counts()

    def _counts(self) -> Iterator[Metric]:
        ledger, demand = self.manager.memory, self.demand()
        yield CounterMetricFamily(
            "dlscale_model_evictions",
            "Models unloaded to make room for another",
            value=ledger.evictions,
        )
        if demand is not None:
            yield CounterMetricFamily(
                "dlscale_model_loads_on_demand",
                "Loads started by a request for a cold model",
                value=demand.loads,
            )
            yield CounterMetricFamily(
                "dlscale_model_loads_refused",
                "Requests for cold models refused because too many models were waiting to load",
                value=demand.refused,
            )
            yield CounterMetricFamily(
                "dlscale_model_loads_dropped",
                "Loads on demand dropped before their turn: no request waited for them any more",
                value=demand.dropped,
            )
            yield GaugeMetricFamily(
                "dlscale_model_loads_waiting",
                "Cold models whose load requests wait for now",
                value=len(demand.loading()),
            )


def _by_device(name: str, doc: str, values: Mapping[str, int]) -> Metric:
    """A gauge with one sample per device, in device order."""
    family = GaugeMetricFamily(name, doc, labels=["device"])
    for device, value in sorted(values.items()):
        family.add_metric([device], value)
    return family
