"""What a frontend needs of the data plane: the DataPlane of one host, or a router over many.

The REST routes and the gRPC servicer call only these methods, so the same frontends serve a
`serving.dataplane.DataPlane` (`dlscale serve`) and the Ray Serve ingress's router over model
deployments (`dlscale.scale`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dlscale.errors import DlscaleError
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.types import (
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)


class Plane(Protocol):
    """The protocol-agnostic operations behind every REST route and gRPC method."""

    #: The shared-memory regions clients registered (the extensions' routes and RPCs use it).
    shared_memory: SharedMemoryRegistry

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def server_metadata(self) -> ServerMetadata: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    def model_config(self, name: str, version: str = "") -> ModelConfigView: ...

    def single_input(self, name: str, version: str = "") -> tuple[TensorSpec, bool]: ...

    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None: ...

    async def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]: ...

    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None: ...

    async def unload_model(self, name: str) -> None: ...

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]: ...

    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]: ...

    def log_settings(
        self, changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | bool | int]: ...
