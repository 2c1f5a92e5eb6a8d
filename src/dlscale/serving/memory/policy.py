"""Which models make room for a load: the least recently used idle ones (a pure rule).

A model is a candidate only while it is idle (no request of it in the server), not pinned and
not held by something else (a loaded pipeline's step, a load or unload of its own). Victims are
taken oldest use first, and only those that free bytes on a device that is short.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dlscale.errors import ConfigError, Unavailable
from dlscale.serving.memory.sizes import Budget, Footprint, show, show_all


class MemoryFull(Unavailable):
    """A load that does not fit the memory budget now: what is resident is pinned or in use."""

    grpc_code = "RESOURCE_EXHAUSTED"


class TooLarge(ConfigError):
    """A model larger than a device's whole memory budget: no eviction could make it fit."""


@dataclass
class Resident:
    """A loaded model as the eviction rule sees it."""

    name: str
    footprint: Footprint
    last_used: float
    pinned: bool = False
    in_use: int = 0
    #: Held by something else: a loaded pipeline's step, or a load or unload of its own.
    held: bool = False
    #: The loaded LoRA adapters placed on its engine: it is a candidate once they all are.
    holders: frozenset[str] = frozenset()

    @property
    def why_kept(self) -> str:
        """Why it is not a candidate by itself ('' when it is one)."""
        if self.pinned:
            return "pinned"
        if self.in_use:
            return f"in use by {self.in_use} request(s)"
        if self.held:
            return "held by a pipeline or a load"
        return f"the base of adapters {sorted(self.holders)}" if self.holders else ""


def totals(sizes: Iterable[Footprint]) -> Footprint:
    """Bytes on each device of these footprints together."""
    out: Footprint = {}
    for size in sizes:
        for device, bytes_ in size.items():
            out[device] = out.get(device, 0) + bytes_
    return out


def shortfall(need: Mapping[str, int], budget: Budget, used: Mapping[str, int]) -> Footprint:
    """Bytes missing on each budgeted device for `need` to fit beside `used` (none: it fits)."""
    short = {d: used.get(d, 0) + size - budget[d] for d, size in need.items() if d in budget}
    return {d: s for d, s in short.items() if s > 0}


def make_room(
    model: str, need: Footprint, budget: Budget, resident: list[Resident]
) -> list[Resident]:
    """The models to evict, least recently used first, so that `model` (needing `need`) fits.

    TooLarge when `need` alone is above a device's budget; MemoryFull, with the figures, when
    even every candidate evicted would not be enough."""
    for device, size in need.items():
        if device in budget and size > budget[device]:
            raise TooLarge(
                f"model {model!r} needs {show(size)} on {device}, above the whole memory budget "
                f"of {show(budget[device])} there: it cannot be loaded under this budget"
            )
    others = sorted((r for r in resident if r.name != model), key=lambda r: r.last_used)
    short = shortfall(need, budget, totals(r.footprint for r in resident))
    victims: list[Resident] = []
    while short and (r := _next_victim(others, victims, short)) is not None:
        victims.append(r)
        short = {d: s - r.footprint.get(d, 0) for d, s in short.items()}
        short = {d: s for d, s in short.items() if s > 0}
    if short:
        raise MemoryFull(refusal(model, need, budget, resident))
    return _spare(victims, shortfall(need, budget, totals(r.footprint for r in resident)))


def _next_victim(
    others: list[Resident], victims: list[Resident], short: Footprint
) -> Resident | None:
    """The least recently used candidate not yet chosen that frees bytes where they are short;
    an adapters' base becomes one once its adapters are all chosen (they go first)."""
    chosen = {v.name for v in victims}
    for r in others:
        if r.name in chosen or not any(r.footprint.get(d, 0) > 0 for d in short):
            continue
        if r.pinned or r.in_use or r.held or not r.holders <= chosen:
            continue
        return r
    return None


def _spare(victims: list[Resident], short: Footprint) -> list[Resident]:
    """Victims the later ones made needless are spared (the most recently used first): a model
    that freed a little of a short device stays when the next one freed enough. An adapter
    whose base goes is not spared: the base cannot go without it."""
    for r in sorted(victims, key=lambda r: -r.last_used):
        rest = [v for v in victims if v is not r]
        if any(r.name in v.holders for v in rest):
            continue
        if all(sum(v.footprint.get(d, 0) for v in rest) >= s for d, s in short.items()):
            victims = rest
    return victims


def refusal(model: str, need: Footprint, budget: Budget, resident: list[Resident]) -> str:
    """The figures of a load that cannot fit: what it needs, the budget, and who holds what."""
    devices = [d for d in need if d in budget]
    held = totals(r.footprint for r in resident)
    holders = ", ".join(
        f"{r.name} ({show_all({d: r.footprint.get(d, 0) for d in devices})}"
        + (f", {r.why_kept}" if r.why_kept else "")
        + ")"
        for r in sorted(resident, key=lambda r: -sum(r.footprint.get(d, 0) for d in devices))
        if any(r.footprint.get(d, 0) for d in devices)
    )
    return (
        f"model {model!r} does not fit the memory budget: it needs "
        f"{show_all({d: need[d] for d in devices})}, the budget is "
        f"{show_all({d: budget[d] for d in devices})}, and "
        f"{show_all({d: held.get(d, 0) for d in devices})} is resident: {holders or 'nothing'}; "
        "unload a model or raise --memory-budget"
    )
