"""How the server manages its models (Triton's --model-control-mode), asked in one place."""

from __future__ import annotations

from enum import StrEnum


class ModelControl(StrEnum):
    """none: every model, fixed; explicit: load and unload over the API; poll: follow the disk;
    on-demand: explicit, and a request for a repository model not loaded loads it."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"
    ON_DEMAND = "on-demand"

    @property
    def api_loads(self) -> bool:
        """Whether clients may load and unload models over the API."""
        return self is not ModelControl.NONE

    @property
    def loads_named(self) -> bool:
        """Whether only the models named at start (--load-model) are loaded then."""
        return self in (ModelControl.EXPLICIT, ModelControl.ON_DEMAND)

    @property
    def on_demand(self) -> bool:
        """Whether a request for a repository model that is not loaded loads it."""
        return self is ModelControl.ON_DEMAND

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
