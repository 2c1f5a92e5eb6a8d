"""What a model version holds: its files, its file's stamp, and the growth read at its load."""

from __future__ import annotations

import os

from dlscale.models.repository import ModelVersion
from dlscale.serving.memory import measure
from dlscale.serving.memory.policy import TooLarge, totals
from dlscale.serving.memory.sizes import Footprint, device_key, show_all

#: What a known size belongs to: a model file as it is now (device, inode, size, modification
#: time) and the config it is loaded under, less the model's name.
Stamp = tuple[int, int, int, int, str]
#: The least a version holds (its files, per device) and its file's stamp.
Files = tuple[Footprint, Stamp]


def files_of(mv: ModelVersion) -> Files:
    """The version's files and its file's stamp (file system calls: off the event loop)."""
    return _files(mv), _stamp(mv)


def _stamp(mv: ModelVersion) -> Stamp:
    """What a remembered size belongs to: the model file as it is now (through links), and the
    config less the model's name (instances, devices, backend options: what sets a footprint).

    Not the name: many names served from one file under one config (a copy per customer or
    per language) hold the same bytes, and keyed by name the first two loads of every one of
    them were measured, each alone on the host with a trim and two readings: 86 of 226 cold
    requests' loads on the bench, 4.5 ms more each at the median (docs/memory.md, "Sizes known
    by file")."""
    config = mv.config.model_dump_json(exclude={"name"})
    try:
        stat = os.stat(mv.model_file)
    except OSError:
        return (0, 0, 0, 0, f"{mv.name}/{mv.version}: {config}")  # its own, measured apart
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, config)


def _files(mv: ModelVersion) -> Footprint:
    """The least a load holds: the version's files, once per instance, on each device."""
    size = measure.folder_bytes(mv.path)
    return totals({device_key(g.device): size * g.count} for g in mv.config.instances)


def growth(
    devices: list[str],
    before: Footprint,
    after: Footprint,
    floor: Footprint,
    known: Footprint,
    hidden: set[str] | frozenset[str] = frozenset(),
) -> Footprint:
    """The growth measured on each device, never below the files.

    An allocator that reuses memory freed by an earlier unload shows less growth than the model
    holds: any growth on the `hidden` devices (memory freed and not handed back yet) keeps the
    size measured at an earlier load of the same file. Over memory handed back, a growth read
    is the load's own: a smaller one replaces the earlier figure (the first load in a process
    also paid the runtime's one-time set-up), down to the files when it read no more than them
    (another thread freed as much as it took: requests answered beside a load); a larger one
    is noise beside it."""
    out: Footprint = {}
    for d in devices:
        if (d in hidden and d in known) or d not in before or d not in after:
            out[d] = max(known.get(d, 0), floor.get(d, 0))  # hidden, or not read: what is known
        else:
            read = max(after[d] - before[d], floor.get(d, 0))
            out[d] = min(read, known[d]) if d in known else read
    return out


def check_limit(mv: ModelVersion, size: Footprint, limit: Footprint) -> None:
    """TooLarge when the size is above the model's own limit on any device."""
    over = {d: size.get(d, 0) for d, cap in limit.items() if size.get(d, 0) > cap}
    if over:
        raise TooLarge(
            f"model {mv.name!r} version {mv.version} holds {show_all(over)} once loaded, above "
            f"its config's memory limit of {show_all({d: limit[d] for d in over})}"
        )


def can_change(devices: list[str], known: Footprint, hidden: set[str]) -> bool:
    """Whether a reading around this load could change the size known for its file: not when
    every device is one whose growth hides in freed memory and whose size is known (`growth`
    keeps the known size there). Such readings were most of them on the bench (freed memory is
    handed back in batches), two trips to a thread per load for nothing (docs/memory.md)."""
    return any(d not in hidden or d not in known for d in devices)
