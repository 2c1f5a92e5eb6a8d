"""The batching policy: the one statement of when a batch goes, read by the Batcher and the planner.

The Batcher (serving/batcher.py) applies these rules to real requests; the planner's queueing
model (plan/queueing.py) applies the same functions to a simulated arrival trace. Times are
seconds on the caller's clock (the Batcher's, or the simulation's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from dlscale.errors import InvalidInput
from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import BatchingConfig

#: Weight of the newest gap in the smoothed gap between arrivals: enough to follow a change of
#: rate within a few arrivals, little enough that one odd gap does not flip the decision.
GAP_WEIGHT = 0.2


@dataclass
class ArrivalGaps:
    """The smoothed gap between the arrivals seen so far: infinite until two have arrived."""

    smoothed: float = math.inf
    last: float | None = None

    def note(self, now: float) -> None:
        """Count an arrival at `now` (seconds)."""
        if self.last is not None:
            gap, before = now - self.last, self.smoothed
            weighted = (1 - GAP_WEIGHT) * before + GAP_WEIGHT * gap
            self.smoothed = gap if math.isinf(before) else weighted  # the first gap: itself
        self.last = now


#: Lone arrivals, while the lone rule is on, before one waits anyway to see whether company comes
#: (a probe; `Company`); doubled after each probe that found none, up to PROBE_MOST, so that a
#: lone client pays one delay in 16 requests at first and one in 1,024 once it has kept alone.
PROBE_FIRST = 16
PROBE_MOST = 1024


@dataclass
class Company:
    """Whether a request can expect company: read from what is in flight, not from the clock.

    A closed-loop client sends its next request only once it has its answer. So a request
    that arrives while no other is in flight (none queued, none computing) cannot be joined by
    its own client, and waiting its delay only delays the answer that the next request waits
    on. Arriving at an idle model is not enough, though: at 32 clients in flight the first
    request of each wave finds the model idle too, with 31 requests about to come. What tells
    the two apart is the batch before: when it went out with others in flight (or held several
    requests), company came then and is expected again; when it went out alone, nobody else
    was there. A request that arrives while another computes has company, whatever comes
    after (a batch's end does not make it alone: at many clients whose requests trickle in,
    each would then go alone). One lone batch after a busy spell turns the rule on, one request
    that meets company turns it off. The Batcher and the planner's simulation
    (plan/queueing.py) both keep one.

    What is in flight cannot show every crowd: grpcio hands the server one call at a time, and
    a batch computed on the event loop (serving/instance.py, `InlineRows`) is done before the
    next call is taken in, so 32 gRPC clients arrive one by one at an idle model, as one client
    would, and each would go alone for good. So while the rule is on, every `probe_after`-th
    lone arrival waits anyway (a probe): company found turns the rule off, none found doubles
    the interval (PROBE_FIRST to PROBE_MOST).

    The gap between arrivals misleads the same crowd: handed over one by one, its calls come a
    whole request's work apart, more than the delay when each batch holds one, and less once
    batches hold several. So a wait that found company (a batch that waited out its delay with
    others in it) makes company `expected` whatever the gap says, until a wait finds none (a
    batch alone after its whole delay); a probe waits whatever the gap says too.
    """

    #: Whether the last batch sent held the only request in flight (a fresh model: yes).
    last_alone: bool = True
    #: Lone arrivals since the rule turned on or since the last probe.
    lone: int = 0
    #: The lone arrival that probes: the interval, doubled by each probe that found none.
    probe_after: int = PROBE_FIRST
    #: Whether the request that arrived last probes (its batch is the probe's outcome).
    probing: bool = False
    #: Whether the last batch that waited out its delay had company.
    found: bool = False

    @property
    def expected(self) -> bool:
        """Whether company is expected within the delay whatever the gap between arrivals: the
        last wait found it, or this request probes."""
        return self.found or self.probing

    def arrives_alone(self, others: int) -> bool:
        """Whether a request arriving now, with `others` queued or computing, waits for no
        one: the model is idle and its last batch went alone too (and the request does not
        probe). It stays alone while no other request arrives."""
        if others or not self.last_alone:
            return False
        self.lone += 1
        if self.lone < self.probe_after:
            return True
        self.lone = 0
        self.probing = True
        return False

    def sent(self, size: int, others: int, waited_out: bool = False) -> None:
        """A batch of `size` requests went out with `others` still queued or computing, after
        its oldest had waited its whole delay or not (`waited_out`)."""
        self.last_alone = size == 1 and others == 0
        if waited_out:
            self.found = size > 1
        if not self.last_alone:
            self.lone, self.probe_after = 0, PROBE_FIRST
        elif self.probing:
            self.probe_after = min(2 * self.probe_after, PROBE_MOST)
        self.probing = False


@dataclass(frozen=True)
class BatchPolicy:
    """How one model's requests are queued and merged: its max_batch_size and its [batching]."""

    max_batch_size: int = 0  # 0: the model takes no batch dim; each request runs alone
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    @classmethod
    def of(cls, config: ModelConfig) -> BatchPolicy:
        """The policy a model's config.toml asks for."""
        return cls(config.max_batch_size, config.batching)

    @cached_property  # asked several times per batch: read once (the policy is frozen)
    def batched(self) -> bool:
        """Whether requests may be merged along a leading batch dimension."""
        return self.max_batch_size > 0

    @cached_property
    def max_queue_delay_s(self) -> float:
        """The longest the oldest request of a forming batch waits for company, in seconds."""
        return self.batching.max_queue_delay_us / 1e6

    @cached_property
    def _preferred(self) -> frozenset[int]:
        return frozenset(self.batching.preferred_batch_sizes)

    def level_of(self, priority: int) -> int:
        """Queue index for a request priority (1 highest); 0 asks for the default level."""
        levels = self.batching.priority_levels
        if priority < 0 or priority > levels:
            raise InvalidInput(
                f"priority {priority} is out of range: this model has priority levels "
                f"1..{levels} (0 for the default)"
            )
        if priority == 0:
            priority = self.batching.default_priority_level or levels
        return priority - 1

    def closes_at(self, rows: int) -> bool:
        """Whether a batch of `rows` goes at once: it is full, a preferred size, or unbatched."""
        return not self.batched or rows >= self.max_batch_size or rows in self._preferred

    def closing_prefix(self, rows: Sequence[int]) -> int:
        """The longest run of leading candidates (their rows) whose batch goes at once, or 0."""
        if not self._preferred:
            # Only a full batch closes (any batch, unbatched), and candidates never pass
            # max_batch_size: all of them or none, without a walk (asked at every arrival).
            return len(rows) if not self.batched or sum(rows) >= self.max_batch_size else 0
        best, total = 0, 0
        for n, r in enumerate(rows, start=1):
            total += r
            if self.closes_at(total):
                best = n
        return best

    def close_by(self, oldest: float) -> float:
        """When a batch whose oldest request arrived at `oldest` goes at the latest."""
        return oldest + self.max_queue_delay_s

    def worth_waiting(self, gap: float, alone: bool = False) -> bool:
        """Whether company is expected within the delay: the smoothed gap between arrivals is
        within it, and the request is not `alone` (`Company.alone`).

        With adaptive_queue_delay a lone client would otherwise pay the whole delay on every
        request; without it the batch always waits, as Triton's does.
        """
        if not self.batching.adaptive_queue_delay:
            return True
        return not alone and gap <= self.max_queue_delay_s

    def to_send(
        self, rows: Sequence[int], oldest: float, now: float, gap: float, alone: bool = False
    ) -> int:
        """How many of the candidates to send now; 0: wait for another arrival or the delay.

        A prefix that closes a batch (full or preferred) goes first; failing that, all of them
        go once the oldest has waited the delay or when no company is expected.
        """
        ready = self.closing_prefix(rows)
        if ready:
            return ready
        if now >= self.close_by(oldest) or not self.worth_waiting(gap, alone):
            return len(rows)
        return 0
