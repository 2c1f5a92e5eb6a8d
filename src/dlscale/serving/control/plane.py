"""The control plane: model load and unload, the repository index, uploads, trace and log settings.

Apart from the data path (serving/dataplane.py): these calls change what the server serves or how
it records, and none of them sits on an inference's way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlscale.errors import DlscaleError, NotFound, Unsupported, known_names, redact_paths
from dlscale.serving.control.bounds import check_name
from dlscale.serving.control.mode import ModelControl
from dlscale.serving.control.uploads import Uploads
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.trace import Tracer
from dlscale.types import RepositoryEntry


class ControlPlane:
    """Loads and unloads a ModelManager's models; reads and changes trace and log settings."""

    def __init__(
        self,
        manager: ModelManager,
        model_control: str = ModelControl.NONE,
        tracer: Tracer | None = None,
        logs: LogControl | None = None,
    ) -> None:
        self.manager = manager
        self.model_control = ModelControl.of(model_control)
        self.tracer = tracer or Tracer()
        self.logs = logs or LogControl()
        #: Models loaded with a load request's own config and files.
        self.uploads = Uploads()
        self._versions: dict[str, tuple[tuple[int, ...], list[str]]] = {}  # by folder stamp

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every model in the repository with its state, one row per served version."""
        known = {e.name: e for e in self.manager.entries()}
        index: list[RepositoryEntry] = []
        names = sorted({*self.manager.repository.names(), *self.uploads.names()})
        for name in names:
            entry = known.get(name)
            state = entry.state.value if entry else "UNAVAILABLE"
            reason = redact_paths(entry.reason) if entry else "not loaded"
            if ready_only and state != "READY":
                continue
            served = entry.versions if entry else {}
            index.extend(
                RepositoryEntry(
                    name, state, reason, str(v), tuple(sorted(served[v].memory.items()))
                )
                for v in sorted(served)
            )
            if not served:
                index.extend(
                    RepositoryEntry(name, state, reason, v) for v in self._on_disk(name) or [""]
                )
        return index

    def _on_disk(self, name: str) -> list[str]:
        """The versions a model not served now would serve (Triton's index names them too);
        none when its config cannot say (the row's reason tells why).

        Remembered while the model's folder and files are unchanged: a repository of 100
        models, 90 not loaded, took 30 ms an index reading their configs again (docs/memory.md)."""
        stamp = _stamp(self.manager.repository.root / name)
        known = self._versions.get(name)
        if stamp is not None and known is not None and known[0] == stamp:
            return known[1]
        try:
            versions = [str(v.version) for v in self.manager.repository.versions(name)]
        except DlscaleError:
            versions = []
        if stamp is not None:
            self._versions[name] = (stamp, versions)
        return versions

    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None:
        """Load or reload a model, from the repository or with a load request's overrides:
        `config` (JSON ModelConfig) and `file:<version>/<name>` (bytes)."""
        check_model_control(self.model_control)
        check_name(name)
        # In a thread: decoding the config and writing the files of a large load takes seconds.
        override = await asyncio.to_thread(self.uploads.override, name, parameters or {})
        source, files = override or (None, None)
        names = self.manager.repository.names() if files is None else []
        if files is None and name not in names:
            raise NotFound(
                f"no model {name!r} in the repository" + known_names(name, names, "it has")
            )
        try:
            await self.manager.load(name, source, files)
        except DlscaleError:
            if files is not None and name not in self.manager.ready_names():
                self.uploads.discard(name)
            raise
        if files is None:
            self.uploads.discard(name)  # loaded from the repository again

    async def unload_model(self, name: str) -> None:
        """Unload a model; its requests in flight finish first."""
        check_model_control(self.model_control)
        await self.manager.unload(name)
        self.uploads.discard(name)

    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]:
        """Triton's trace extension: the settings (of a model) after applying `changes`."""
        if model:
            self.manager.get(model)  # an unknown or unready model is an error, as in Triton
        return self.tracer.update(changes, model) if changes else self.tracer.settings(model)

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, str | bool | int]:
        """Triton's logging extension: the settings after applying `changes`."""
        return self.logs.update(changes) if changes else self.logs.settings()


def _stamp(folder: Path) -> tuple[int, ...] | None:
    """What a model's versions on disk depend on: its folder's and its files' times and sizes
    (a version folder added or removed changes the folder's time); None when it cannot be read."""
    try:
        with os.scandir(folder) as entries:
            files = sorted((e.name, e.stat()) for e in entries if e.is_file())
        times = (n for _, s in files for n in (s.st_mtime_ns, s.st_size))
        return (os.stat(folder).st_mtime_ns, *times)
    except OSError:
        return None


def check_model_control(model_control: str) -> None:
    """Loading and unloading over the API are refused under --model-control none."""
    if not ModelControl.of(model_control).api_loads:
        raise Unsupported(
            "the server was started with --model-control none: models cannot be loaded or "
            "unloaded through the API (start it with --model-control explicit)"
        )
