"""Loading one model version apart from the manager's states: its backends and instances, the
check of their signature against the config, the warm-up, and the runner that serves it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.base import FailureReport
from dlscale.errors import ConfigError
from dlscale.models.repository import ModelVersion
from dlscale.models.runner import options_for
from dlscale.serving.adapters import place
from dlscale.serving.batcher import Batcher
from dlscale.serving.caller import CallRoute, ServerCaller
from dlscale.serving.classification import read_labels
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.pipeline import Lookup, Pipeline
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.qos.leases import lease_engines
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.qos.steps import pace_engines
from dlscale.serving.runners import BatchRunner, PipelineRunner, Runner, StreamRunner
from dlscale.serving.seats import Seats
from dlscale.serving.served import ServedVersion, next_serial
from dlscale.serving.warmup import Warmed, Warmup

#: How the backends of one load (model name, load serial) report that they can no longer serve.
Reporter = Callable[[str, int], FailureReport]


class Loader:
    """Makes the served version of a model version (and takes one apart: `close_version`).

    It holds no state of its own: the manager keeps which versions serve and in what state,
    and hands in how to look up a loaded model (a pipeline's steps) and how a load's backends
    report their death (the manager's failure handling).
    """

    def __init__(
        self, gates: DeviceGates, calls: CallRoute, lookup: Lookup, reporter: Reporter
    ) -> None:
        self.gates = gates
        self.calls = calls
        self._lookup = lookup
        self._reporter = reporter

    async def load(self, mv: ModelVersion) -> ServedVersion:
        """The served version of `mv`: a pipeline checked against its steps, or its backends'
        instances loaded, checked against the config, warmed up, behind a batcher (or seats)."""
        config, stats = mv.config, ModelStats(mv.name, str(mv.version))
        if config.is_pipeline:
            return self._pipeline_version(mv, stats)
        if config.is_adapter:
            return await self._adapter_version(mv, stats)
        # Off the event loop: a label file is read whole (bounded, serving/classification.py).
        labels = {
            t.name: await asyncio.to_thread(read_labels, mv.folder, t.label_file)
            for t in config.outputs or ()
            if t.label_file
        }
        instances, placements, warmed = [], [], list[Warmed]()
        qos: TenantQos | None = None
        serial, called = next_serial(), set[tuple[str, str]]()
        try:
            for group in config.instances:
                options = self._options(mv, group.device, called, serial)
                for i in range(group.count):
                    backend = create_backend(config.backend, mv.model_file, options)
                    label = f"{mv.name}-v{mv.version}-{group.device}-{i}"
                    instance = Instance(backend, label)
                    instances.append(instance)
                    placements.append((label, group.device))
                    warmed.append(await instance.load(Warmup(mv, self.gates.clock)))
            inputs, outputs = warmed[0].inputs, warmed[0].outputs
            caps = instances[0].backend.capabilities
            if caps.streams_answers:  # batches itself: seats, no batcher, no warm-up
                seats = Seats.of(config, instances, stats, caps.generates_text)
                if caps.paces_steps or caps.pauses_steps:
                    # Each engine is one slot of a pool, whatever sequences it holds: it runs
                    # one step (or one lease between pauses) at a time.
                    name, admission = f"{mv.name}/{mv.version}", seats.queue.admission
                    qos = self.gates.enrol(name, config, placements, seats.capacity, admission)
                    if qos is not None:
                        qos.attach(instances, each=1)
                # Its engine's steps take the device's slots, beside the batchers' batches;
                # vLLM's steps run in its own process: it leases the device between pauses.
                if qos is not None and caps.paces_steps:
                    pace_engines(qos, instances)
                elif qos is not None:
                    seats.watch = lease_engines(qos, instances)
                runner: Runner = StreamRunner(seats)
            else:
                qos = self.gates.enrol(f"{mv.name}/{mv.version}", config, placements)
                # The warm-up's times: the device schedulers' first service times (they relearn).
                for instance, found in zip(instances, warmed, strict=True):
                    for rows, seconds in found.times:
                        if qos is not None:
                            qos.tenant_of(instance.name).service.observe(rows, seconds)
                batcher = Batcher(BatchPolicy.of(config), instances, stats, self.gates.clock, qos)
                batcher.start()
                runner = BatchRunner(batcher)
        except BaseException:
            if qos is not None:
                qos.leave()
            await asyncio.gather(*(i.close() for i in instances), return_exceptions=True)
            raise
        return ServedVersion(
            mv, inputs, outputs, instances, runner, stats, labels, qos, serial, called
        )

    def _options(
        self, mv: ModelVersion, device: str, called: set[tuple[str, str]], serial: int
    ) -> BackendOptions:
        """What each backend instance of `mv` on `device` is built with."""
        return replace(
            options_for(mv.config, device),
            # Read by backends whose models call models (Capabilities.calls_models): the
            # server's paths, on the running loop.
            caller=ServerCaller(self.calls, asyncio.get_running_loop(), called),
            report_failure=self._reporter(mv.name, serial),
        )

    def _pipeline_version(self, mv: ModelVersion, stats: ModelStats) -> ServedVersion:
        """A pipeline version: checked against its loaded step models; no instance, no batcher."""
        pipeline = Pipeline(mv.name, mv.config)
        pipeline.check(self._lookup)
        inputs = mv.config.tensor_specs("inputs") or []
        outputs = mv.config.tensor_specs("outputs") or []
        return ServedVersion(mv, inputs, outputs, [], PipelineRunner(pipeline), stats)

    async def _adapter_version(self, mv: ModelVersion, stats: ModelStats) -> ServedVersion:
        """A LoRA adapter's version: placed on the engines of its base's newest loaded version
        (serving/adapters.py); no instance of its own."""
        if mv.path == mv.folder:
            raise ConfigError(
                f"adapter {mv.name!r}: its PEFT files go in a version folder ({mv.name}/1/)"
            )
        base = self._lookup(mv.config.base, "")
        if not isinstance(base, ServedVersion) or base.config.is_adapter:
            raise ConfigError(f"adapter {mv.name!r}: its base {mv.config.base!r} is no engine")
        runner = await place(mv.name, mv.path, mv.config.base, base.runner)
        return ServedVersion(mv, list(base.inputs), list(base.outputs), [], runner, stats)


async def close_version(served: ServedVersion, grace_s: float | None = None) -> None:
    """Stop a version: its requests finish within the grace, then its instances close."""
    await served.runner.close(grace_s)
    if served.qos is not None:
        served.qos.leave()
    # The batcher waited the grace: a batch still running now is stopped at once.
    left = None if grace_s is None else 0.0
    await asyncio.gather(*(i.close(left) for i in served.instances), return_exceptions=True)
