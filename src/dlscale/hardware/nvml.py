"""Every NVML call dlscale makes goes through `Nvml`, so a test can hand in a stand-in library.

`lib` is the `pynvml` module (imported lazily) or any object with the functions dlscale asks for
and an `NVMLError` class (tests/unit/hardware/fake_nvml.py is one).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

#: NVML constants used with the calls (values from nvml.h; stable across releases).
CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host: no pynvml, no driver, or no library."""


@dataclass(frozen=True)
class Answer:
    """What one NVML call returned, or why it returned nothing."""

    value: Any = None
    why: str | None = None

    @property
    def ok(self) -> bool:
        """Whether NVML answered."""
        return self.why is None


class Nvml:
    """An initialised NVML: `ask` makes one call and turns NVML errors into plain reasons."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    @classmethod
    def open(cls, lib: Any | None = None) -> Nvml:
        """Load pynvml (unless `lib` is given) and initialise it; NvmlUnavailable says why not."""
        if lib is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
            lib = pynvml
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not start: {exc}") from None
        except OSError as exc:
            raise NvmlUnavailable(f"NVML did not load: {exc}") from None
        return cls(lib)

    def close(self) -> None:
        """Shut NVML down (NVML counts inits, so this undoes one open)."""
        with contextlib.suppress(self._lib.NVMLError):
            self._lib.nvmlShutdown()

    def ask(self, call: str, *args: Any) -> Answer:
        """Call `lib.<call>(*args)`; NotSupported, NoPermission and the like become `why`."""
        try:
            value = getattr(self._lib, call)(*args)
        except self._lib.NVMLError as exc:
            return Answer(why=f"{call}: {exc}")
        if isinstance(value, bytes):
            value = value.decode()
        return Answer(value=value)

    def value(self, call: str, *args: Any) -> Any:
        """The answer of a call, or None when NVML cannot give it."""
        return self.ask(call, *args).value
