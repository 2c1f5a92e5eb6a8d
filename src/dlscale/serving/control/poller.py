"""--model-control poll: watch the repository and load, reload or unload what changed."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from dlscale.errors import DlscaleError
from dlscale.serving.manager import ModelManager

log = logging.getLogger("dlscale.models")

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    """What a reload depends on: every file's path, size and modification time."""
    return tuple(
        sorted(
            (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")
            if p.is_file()
        )
    )


class RepositoryPoller:
    """Compares the repository with what is loaded every `interval_s` seconds."""

    def __init__(self, manager: ModelManager, interval_s: float = 5.0) -> None:
        self.manager = manager
        self.interval_s = interval_s
        self._seen: dict[str, Fingerprint] = {}
        self._task: asyncio.Task[None] | None = None

    def remember_loaded(self) -> None:
        """Take the models loaded at start-up as the baseline."""
        root = self.manager.repository.root
        for entry in self.manager.entries():
            self._seen[entry.name] = fingerprint(root / entry.name)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def poll_once(self) -> None:
        """One comparison: new or changed folders load, vanished ones unload."""
        root = self.manager.repository.root
        names = set(self.manager.repository.names())
        for name in sorted(names):
            current = fingerprint(root / name)
            if self._seen.get(name) == current:
                continue
            self._seen[name] = current
            try:
                await self.manager.load(name)
            except DlscaleError as exc:
                log.warning("model %s: not loaded: %s", name, exc)
        # Models a pipeline uses go last: a pipeline that vanished with them unloads first.
        vanished = set(self._seen) - names
        for name in sorted(vanished, key=lambda n: (bool(self.manager.pipelines_using(n)), n)):
            del self._seen[name]
            try:
                await self.manager.unload(name)
            except DlscaleError as exc:
                log.warning("model %s: unload failed: %s", name, exc)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll_once()
