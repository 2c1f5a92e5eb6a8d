"""The Plane of one host: its DataPlane and its ControlPlane over one ModelManager, as one object.

The frontends make one kind of call (frontends/plane.py's `Plane`); here both rooms answer it, each
from its own module. Nothing is added but the models' metrics text (the REST port's /metrics),
which the DataPlane may not import: the data path and model control stay apart.
"""

from __future__ import annotations

import functools

from dlscale.serving.cache import ResponseCache
from dlscale.serving.control.demand import PARALLEL_LOADS, WAITING_LOADS, OnDemand
from dlscale.serving.control.mode import ModelControl
from dlscale.serving.control.plane import ControlPlane
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.collectors import models_registry
from dlscale.serving.metrics.exposition import render
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.trace import Tracer
from dlscale.serving.regions.registry import SharedMemoryRegistry


class HostPlane(DataPlane, ControlPlane):
    """The data path and model control of one host's models, sharing their manager and tracer."""

    def __init__(
        self,
        manager: ModelManager,
        model_control: str = ModelControl.NONE,
        shared_memory: SharedMemoryRegistry | None = None,
        tracer: Tracer | None = None,
        logs: LogControl | None = None,
        strict_readiness: bool = True,
        cache: ResponseCache | None = None,
        cold_loads: int = WAITING_LOADS,
        parallel_loads: int = PARALLEL_LOADS,
    ) -> None:
        tracer = tracer or Tracer()
        ControlPlane.__init__(self, manager, model_control, tracer, logs)
        DataPlane.__init__(self, manager, shared_memory, tracer, strict_readiness, cache)
        self.exposition = functools.partial(render, models_registry(manager))
        if self.model_control.on_demand:
            self.demand = OnDemand(manager, max(2, parallel_loads), cold_loads)
