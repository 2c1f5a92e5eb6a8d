"""LoRA adapters served as models of their own, on their base model's engine.

An adapter (config.toml `backend = "lora"`, `base = "<model>"`; its version folder a PEFT
folder) has no instance of its own: loading it places its weights on each engine of its base
model's newest loaded version, and its requests wait in the base's seats (one queue, one
`max_num_seqs` for the base and all its adapters), each naming the adapter to the engine
(`Sampling.adapter`). While an adapter is loaded its base is held (as a pipeline's steps are):
it is neither evicted nor unloaded, nor reloaded under it. docs/generative.md, "LoRA adapters".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlscale.backends.generative.contract import AdapterHost
from dlscale.errors import ConfigError, DlscaleError, Unavailable
from dlscale.serving.runners import Runner, seats_of, streams_only
from dlscale.serving.seats import Seats
from dlscale.types import ModelKind

#: Each placement's number: the engine's key of an adapter is its name and this.
_LOADS = itertools.count(1)


class AdapterRunner:
    """An adapter's runner: its base's seats, and its own streams (closed with it)."""

    kind = ModelKind.GENERATIVE

    def __init__(
        self, name: str, key: str, base: str, seats: Seats, hosts: Sequence[AdapterHost]
    ) -> None:
        self.name = name
        #: What the engines know this load of it by (a reload places the new one beside it).
        self.key = key
        self.seats = seats
        #: The base model, held while the adapter is loaded (the manager's `pipelines_using`).
        self.models: tuple[str, ...] = (base,)
        self._hosts = list(hosts)
        self._refusal: DlscaleError | None = None
        #: Its streams, by the token each was handed, with the task that runs it (cut cancels).
        self._streams: dict[object, asyncio.Task[Any] | None] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def refuse_early(self) -> DlscaleError | None:
        return self._refusal or self.seats.queue.refuse_early()

    submit = streams_only

    def enter(self) -> object:
        """A stream of this adapter starts (refused once it is unloading or its base died);
        the token its `leave` hands back."""
        if self._refusal is not None:
            raise self._refusal
        token = object()
        self._streams[token] = asyncio.current_task()
        self._idle.clear()
        return token

    def leave(self, token: object) -> None:
        """A stream of this adapter ended."""
        self._streams.pop(token, None)
        if not self._streams:
            self._idle.set()

    def cut(self, error: DlscaleError) -> None:
        for task in list(self._streams.values()):
            if task is not None:
                task.cancel()

    def fail(self, error: DlscaleError) -> None:
        self._refusal = error

    async def close(self, grace_s: float | None = None) -> None:
        """Refuse new requests, let its streams end (within the grace), then free its weights."""
        self._refusal = self._refusal or Unavailable(f"adapter {self.name!r} is unloading")
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            self.cut(self._refusal)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 30.0)
        for host in self._hosts:
            await asyncio.to_thread(host.unload_adapter, self.key)


def stream_seats(runner: Runner) -> Seats | None:
    """The seats a runner's streams wait in: its own, or an adapter's base's."""
    return runner.seats if isinstance(runner, AdapterRunner) else seats_of(runner)


async def place(name: str, folder: Path, base: str, runner: Runner) -> AdapterRunner:
    """Load adapter `name` from `folder` onto the engines behind `base`'s runner."""
    seats = seats_of(runner)
    if seats is None or not seats.generative:
        raise ConfigError(f"adapter {name!r}: its base {base!r} is no generative model")
    hosts: list[AdapterHost] = [
        i.backend for i in seats.instances if isinstance(i.backend, AdapterHost)
    ]
    if len(hosts) != len(seats.instances):
        raise ConfigError(f"adapter {name!r}: the engine of its base {base!r} serves no adapters")
    key = f"{name}@{next(_LOADS)}"
    placed: list[AdapterHost] = []
    try:
        for host in hosts:
            await asyncio.to_thread(host.load_adapter, key, folder)
            placed.append(host)
    except BaseException:
        for host in placed:
            await asyncio.to_thread(host.unload_adapter, key)
        raise
    return AdapterRunner(name, key, base, seats, placed)
