"""How the server manages its models (Triton's --model-control-mode), asked in one place."""

from __future__ import annotations

from enum import StrEnum


class ModelControl(StrEnum):
    """none: every model, fixed; explicit: load and unload over the API; poll: follow the disk."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"

    @property
    def api_loads(self) -> bool:
        """Whether clients may load and unload models over the API."""
        return self is not ModelControl.NONE

    @property
    def loads_named(self) -> bool:
        """Whether only the models named at start (--load-model) are loaded then."""
        return self is ModelControl.EXPLICIT

    @property
    def polls(self) -> bool:
        """Whether the repository folder is watched and followed."""
        return self is ModelControl.POLL

    @classmethod
    def of(cls, value: str) -> ModelControl:
        """The mode named `value`; a ValueError that lists the modes otherwise."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"model control {value!r}: expected one of {names}") from None
