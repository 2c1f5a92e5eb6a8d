"""A model's Ray Serve replica: the ModelManager, Batcher and backend of `dlscale serve`.

Each replica loads one model of the repository exactly as the single-host server does, and
answers typed requests through its own DataPlane, so dynamic batching happens inside the
replica. The ingress reaches replicas through Ray Serve handles (`scale/router.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import ray

from dlscale.errors import DlscaleError, InvalidInput
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository
from dlscale.scale.metrics import RayMetricsMirror
from dlscale.scale.placement import placed_config
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.collectors import InferenceCollector
from dlscale.serving.streams import aclose
from dlscale.types import (
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    TensorSpec,
)

log = logging.getLogger("dlscale.scale")


@dataclass(frozen=True)
class VersionView:
    """What the ingress answers about one served version without asking a replica."""

    metadata: ModelMetadata
    config: ModelConfigView
    #: The one input and whether the model batches; None when the raw binary form is refused.
    single_input: tuple[TensorSpec, bool] | None
    #: Why the raw binary form is refused (the DataPlane's words), when it is.
    single_input_refusal: str = ""


@dataclass(frozen=True)
class ModelView:
    """A deployed model as one of its replicas describes it: every served version."""

    name: str
    versions: dict[int, VersionView]
    #: The Ray actor name of the replica that answered (`ray.get_actor(name, namespace="serve")`).
    replica: str


class PlacedRepository(ModelRepository):
    """The repository, with each GPU instance moved to the GPUs Ray gave this replica."""

    def config(self, name: str) -> ModelConfig:
        return placed_config(super().config(name))


class ModelReplica:
    """One replica of one model; Ray Serve constructs it on a worker and calls its methods."""

    # Ray Serve awaits an async constructor on the replica's event loop, where the batcher and
    # the requests then run; a plain __init__ could not start the batcher there.
    async def __init__(  # type: ignore[misc]
        self, repository: str, model: str, metrics_interval_s: float = 5.0
    ) -> None:
        self.model = model
        self.manager = ModelManager(PlacedRepository(Path(repository)))
        await self.manager.load(model)
        self.dataplane = DataPlane(self.manager)
        self.manager.calls.connect(self.dataplane.call_paths())  # BLS: this replica's path
        self._mirror = RayMetricsMirror(InferenceCollector(self.manager), metrics_interval_s)
        self._mirror_task = asyncio.get_running_loop().create_task(self._mirror.run())

    async def infer(self, request: InferenceRequest) -> InferenceResponse | DlscaleError:
        """One request through this replica's DataPlane and batcher; its error is an answer.

        A client's error returned, not raised: Ray would log each raised one with its traceback
        in the replica and build a RayTaskError around it; `calls.remote_call` raises it.
        """
        try:
            return await self.dataplane.infer(request)
        except DlscaleError as exc:
            return exc

    async def stream(
        self, request: InferenceRequest
    ) -> AsyncIterator[InferenceResponse | DlscaleError]:
        """A model that streams: its responses through this replica's DataPlane; an error is
        the last item (not raised, as `infer` returns it). Ray cancels this generator when the
        ingress's client left, which closes the stream and frees the sequence."""
        responses = self.dataplane.stream(request)
        try:
            async for response in responses:
                yield response
        except DlscaleError as exc:
            yield exc
        finally:
            await aclose(responses)

    def describe(self) -> ModelView:
        """Metadata, config and raw-input form of every served version."""
        entry = next(e for e in self.manager.entries() if e.name == self.model)
        versions = {v: self._version_view(str(v)) for v in entry.versions}
        return ModelView(self.model, versions, _actor_name())

    def _version_view(self, version: str) -> VersionView:
        plane = self.dataplane
        metadata = plane.model_metadata(self.model, version)
        config = plane.model_config(self.model, version)
        try:
            return VersionView(metadata, config, plane.single_input(self.model, version))
        except InvalidInput as exc:
            return VersionView(metadata, config, None, exc.message)

    def check_health(self) -> None:
        """Ray Serve's health probe: a replica whose model is not ready is restarted."""
        if not self.dataplane.model_ready(self.model):
            raise RuntimeError(f"model {self.model!r} is not ready in this replica")

    async def __del__(self) -> None:
        """Ray Serve's graceful stop: requests in flight finish, then the model unloads."""
        self._mirror_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._mirror_task
        self.dataplane.stop_accepting()
        await self.manager.close()


def _actor_name() -> str:
    try:
        return ray.get_runtime_context().get_actor_name() or ""
    except RuntimeError:  # not inside a Ray actor
        return ""
