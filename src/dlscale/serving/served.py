"""What the model manager serves: a model's state, and each loaded version of it."""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
from dataclasses import dataclass, field
from typing import cast

from dlscale.backends.base import ReadyBackend
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelVersion
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.pipeline import Pipeline
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.request_plan import RequestPlan
from dlscale.serving.runners import PipelineRunner, Runner
from dlscale.types import TensorSpec

#: A new load's serial: no two loads of a server's life share one.
next_serial = itertools.count(1).__next__


class ModelState(enum.StrEnum):
    """Where a model is in its life (the repository index reports these)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ServedVersion:
    """One loaded version: its signature, instances, runner and statistics; a pipeline has
    no instance (each of its step models has its own)."""

    version: ModelVersion
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    instances: list[Instance]
    #: What the core calls to serve it, whatever its kind (serving/runners.py).
    runner: Runner
    stats: ModelStats
    #: Class labels by output, from the config's label files (the classification extension).
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    qos: TenantQos | None = None  # its slot pool at the device gates (None: QoS turned off)
    #: Which load this is: a reload is another serial, so nothing keyed on the old one (the
    #: response cache's answers) can answer for the new one.
    serial: int = field(default_factory=next_serial)
    #: The (model, version) pairs its backends have called (models that call models, BLS),
    #: filled as they call: the response cache's key names their loads too.
    called: set[tuple[str, str]] = field(default_factory=set)
    #: Bytes it holds by device key (cpu, gpu0, ...), measured at its load (docs/memory.md).
    memory: dict[str, int] = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.version.config

    @functools.cached_property
    def plan(self) -> RequestPlan:
        """What each of its requests is checked against and answered with (built once)."""
        return RequestPlan(
            self.version.name,
            self.version.version,
            self.inputs,
            self.outputs,
            self.config.max_batch_size,
            self.runner.kind.streams,
        )

    async def answers_ready(self) -> bool:
        """Whether each instance whose backend tells its readiness at run time says it can serve
        (Triton's instance readiness: a Python model's worker process alive, its is_ready)."""
        asked = [
            cast(ReadyBackend, i.backend).ready()
            for i in self.instances
            if i.backend.capabilities.reports_readiness
        ]
        return all(await asyncio.gather(*asked))

    @property
    def pipeline(self) -> Pipeline | None:
        """Its steps, when it is a pipeline (the response cache and nested pipelines read them)."""
        return self.runner.pipeline if isinstance(self.runner, PipelineRunner) else None


@dataclass
class ModelEntry:
    """A model's state and, while ready, its served versions."""

    name: str
    state: ModelState
    reason: str = ""
    versions: dict[int, ServedVersion] = field(default_factory=dict)
