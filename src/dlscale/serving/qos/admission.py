"""Admission by a model's [qos] limits: a rate limit (token bucket) and a max in flight.

A request over either limit is refused at once with 429 / RESOURCE_EXHAUSTED and a message
naming the limit, before it takes a place in the queue. Times are seconds on the caller's
clock, so tests give their own.
"""

from __future__ import annotations

import collections
import math

from dlscale.errors import TooManyRequests
from dlscale.models.config_sections import QosConfig

#: The `limit` label of refused requests (metrics) for each limit.
RATE_LIMIT = "rate_limit"
MAX_IN_FLIGHT = "max_in_flight"


class Admission:
    """Admits a model's requests within its rate limit and max in flight; counts refusals."""

    def __init__(self, model: str, qos: QosConfig, now: float) -> None:
        self.model = model
        self.rate = qos.rate_limit
        self.burst = float(qos.rate_burst or max(1.0, math.ceil(qos.rate_limit)))
        self.max_in_flight = qos.max_in_flight
        self._tokens = self.burst
        self._last = now
        self.refused: collections.Counter[str] = collections.Counter()

    def admit(self, in_flight: int, now: float) -> None:
        """Take one request, or raise TooManyRequests; `in_flight`: queued or computing now."""
        refusal = self.refuse_early(in_flight, now)
        if refusal is not None:
            raise refusal
        if self.rate:
            self._tokens -= 1

    def refuse_early(self, in_flight: int, now: float) -> TooManyRequests | None:
        """The refusal `admit` would raise now, counted as it counts; admitting takes no token.

        The REST frontend asks before it reads a request's body, so that a flood refused here
        costs no body read or decode.
        """
        if self.max_in_flight and in_flight >= self.max_in_flight:
            self.refused[MAX_IN_FLIGHT] += 1
            return TooManyRequests(
                f"model {self.model!r} has {in_flight} requests in flight, its max_in_flight "
                f"([qos]); retry when one completes"
            )
        if not self.rate:
            return None
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            self.refused[RATE_LIMIT] += 1
            wait = (1 - self._tokens) / self.rate
            return TooManyRequests(
                f"model {self.model!r} is over its rate limit of {self.rate:g} requests/s "
                f"(burst {self.burst:g}, [qos]); retry in {wait * 1e3:.1f} ms"
            )
        return None
