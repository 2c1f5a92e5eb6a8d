"""The null backend: computes nothing, so the server, batcher and clients around it are measured.

tinygrad's null device, for serving: the model's tensors come from config.toml, each output is
the input at the same position when datatype and shape agree (the same array, no copy) or else
zeros of its declared shape, and an optional sleep per batch and per row stands in for an
accelerator with a known service time (docs/backends.md). Naming a `simulated_device` makes
that sleep hold the device exclusively: the batches of every null model naming it, in this
process, run one at a time in arrival order, as kernels on one accelerator queue (sleeping
costs no CPU, so the host's noise stays out of the device's time).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

import numpy as np

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.errors import ConfigError
from dlscale.types import Datatype, TensorSpec

#: The keys the null backend takes from [backend_options]: microseconds >= 0.
DELAY_KEYS = ("delay_us", "delay_us_per_row")
#: The key naming a simulated device: a string (any name; models naming one share it).
DEVICE_KEY = "simulated_device"


class SimulatedDevice:
    """An accelerator stand-in: holds run one at a time, first come first served.

    A plain lock would not do: the thread that releases it may take it again at once, so one
    model's instance could keep the device while another's batch waits indefinitely.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._busy = False
        self._queue: collections.deque[threading.Event] = collections.deque()

    def hold(self, seconds: float) -> None:
        """Wait for the device, keep it for `seconds` (sleeping), then hand it to the next."""
        turn = None
        with self._lock:
            if self._busy:
                turn = threading.Event()
                self._queue.append(turn)
            self._busy = True
        if turn is not None:
            turn.wait()  # the device is handed over: still busy, now ours
        try:
            time.sleep(seconds)
        finally:
            with self._lock:
                if self._queue:
                    self._queue.popleft().set()
                else:
                    self._busy = False


_devices: dict[str, SimulatedDevice] = {}
_devices_lock = threading.Lock()


def simulated_device(name: str) -> SimulatedDevice:
    """The process's simulated device named `name` (made on first use, kept for the process)."""
    with _devices_lock:
        return _devices.setdefault(name, SimulatedDevice(name))


@dataclass(frozen=True)
class _Answer:
    """How one output is made: echo the input named `source`, or zeros of `spec`'s shape."""

    spec: TensorSpec
    source: str | None


class NullBackend:
    """A Backend that answers with its inputs or zeros, after an optional simulated compute time."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options
        self.delay_us, self.delay_us_per_row = _delays(path, options)
        name = options.extra.get(DEVICE_KEY)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(
                f"{path}: field 'backend_options.{DEVICE_KEY}': expected a device name, "
                f"got {name!r}"
            )
        self.device = simulated_device(name) if name else None
        self.inputs, self.outputs = list(options.inputs), list(options.outputs)
        self._answers: list[_Answer] = []

    def load(self) -> None:
        """Plan each output from the declared tensors; nothing is read from the marker file."""
        inputs, outputs = self.options.inputs, self.options.outputs
        if not inputs or not outputs:
            raise ConfigError(
                f"{self.path}: backend 'null' needs [[inputs]] and [[outputs]] in config.toml "
                "(it has no model file to read them from)"
            )
        answers = []
        for i, out in enumerate(outputs):
            echoed = i < len(inputs) and _same_kind(inputs[i], out)
            if not echoed and -1 in out.shape[self._batch_dims :]:
                raise ConfigError(
                    f"{self.path}: backend 'null' answers output {out.name!r} with zeros, which "
                    f"needs fixed dimensions, but its shape is {list(out.shape)}"
                )
            answers.append(_Answer(out, inputs[i].name if echoed else None))
        self._answers = answers

    @property
    def _batch_dims(self) -> int:
        return 1 if self.options.max_batch_size > 0 else 0

    @property
    def capabilities(self) -> Capabilities:
        """One batch at a time, on host arrays; when it computes nothing at all (no delay, no
        simulated device), measured cheap on the event loop as a tiny model's would be: a
        delay stands in for a device's time, which its thread waits out."""
        idle = self.device is None and not self.delay_us and not self.delay_us_per_row
        return Capabilities(inline_measured=idle)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sleep the configured service time (the GIL is released; holding the simulated device
        when one is named), then echo or answer zeros."""
        first = next(iter(inputs.values()))
        rows = first.shape[0] if self._batch_dims and first.ndim else 1
        seconds = (self.delay_us + self.delay_us_per_row * rows) / 1e6
        if self.device is not None:
            self.device.hold(seconds)
        elif seconds > 0:
            time.sleep(seconds)
        return {
            a.spec.name: inputs[a.source] if a.source is not None else _zeros(a.spec, rows)
            for a in self._answers
        }

    def unload(self) -> None:
        self._answers = []


def _same_kind(a: TensorSpec, b: TensorSpec) -> bool:
    return a.datatype is b.datatype and a.shape == b.shape


def _zeros(spec: TensorSpec, rows: int) -> np.ndarray:
    shape = tuple(rows if d == -1 else d for d in spec.shape)
    if spec.datatype is Datatype.BYTES:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, spec.datatype.numpy)


def _delays(path: Path, options: BackendOptions) -> tuple[float, float]:
    """delay_us and delay_us_per_row from [backend_options]; an unknown key is refused."""
    unknown = sorted(set(options.extra) - {*DELAY_KEYS, DEVICE_KEY})
    if unknown:
        raise ConfigError(
            f"{path}: backend 'null' takes only {list(DELAY_KEYS)} and {DEVICE_KEY!r} in "
            f"[backend_options], got {unknown}"
        )
    values = []
    for key in DELAY_KEYS:
        value = options.extra.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, Real) or value < 0:
            raise ConfigError(
                f"{path}: field 'backend_options.{key}': expected microseconds >= 0, got {value!r}"
            )
        values.append(float(value))
    return values[0], values[1]
