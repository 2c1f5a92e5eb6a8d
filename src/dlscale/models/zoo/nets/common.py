"""Helpers shared by the zoo's networks: seeded weights and single-threaded determinism."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: Extra values a network reports for its config's [metadata] (e.g. held-out accuracy).
Metadata = dict[str, str | int | float]


@contextmanager
def deterministic(seed: int) -> Iterator[torch.Generator]:
    """Seed a private generator and run on one thread.

    One thread, because a parallel reduction may sum in a different order with a different
    thread count, and the weights it computes (training, BatchNorm statistics) would then
    differ in the last bit from one machine to the next.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield torch.Generator().manual_seed(seed)
    finally:
        torch.set_num_threads(threads)
