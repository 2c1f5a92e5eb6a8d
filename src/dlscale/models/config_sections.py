"""The sections of config.toml that say how a model is served beside others: [batching] (how
its requests form batches and queue), [qos] (its objectives and share of the device),
[routing] (how a fleet's router picks its replica) and [memory] (its place under the memory
budget). `models/config.py` holds them in its `ModelConfig`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]


#: Every table of config.toml: unknown fields are errors (a misspelt knob silently ignored is
#: worse than a refusal), and a parsed config does not change.
STRICT = ConfigDict(extra="forbid", frozen=True)


class Strict(BaseModel):
    """A table of config.toml (this module's; `models/config.py` bases its own on STRICT too,
    each on BaseModel itself, where linters see a pydantic model)."""

    model_config = STRICT


class BatchingConfig(Strict):
    """Dynamic batching and queue policy (Triton's dynamic_batching and default_queue_policy)."""

    max_queue_delay_us: NonNegative = 0
    preferred_batch_sizes: list[Positive] = []
    #: Number of priority levels; requests ask for 1 (highest) .. priority_levels.
    priority_levels: Positive = 1
    #: The level of requests that give no priority (or 0); defaults to the lowest.
    default_priority_level: NonNegative = 0
    #: Requests beyond this many queued are refused at once; 0 means unbounded.
    max_queue_size: NonNegative = 0
    #: Queue timeout for requests that give none; 0 means none.
    default_timeout_us: NonNegative = 0
    #: Send a batch at once when requests arrive further apart than the delay, or when one
    #: arrives alone in flight after a lone batch (no company is expected: serving/policy.py's
    #: Company); false waits out max_queue_delay_us every time, as Triton does.
    adaptive_queue_delay: bool = True

    @model_validator(mode="after")
    def _levels(self) -> BatchingConfig:
        if self.default_priority_level > self.priority_levels:
            raise ValueError(
                f"default_priority_level {self.default_priority_level} is above "
                f"priority_levels {self.priority_levels}"
            )
        return self


class QosConfig(Strict):
    """Quality of service of a model that shares its devices with others (docs/qos.md).

    Any [qos] table, even an empty one, puts the model's devices under the device scheduler.
    """

    #: The p99 of a request's time in the server (queue and compute) to hold; 0: best effort.
    latency_objective_us: NonNegative = 0
    #: Generative models: the p99 of a request's time to its first token (its wait for a
    #: sequence slot and its prefill) to hold, and of its time per output token after the
    #: first; 0: none. The fleet's autoscaler follows them (docs/scale.md).
    ttft_objective_us: NonNegative = 0
    tpot_objective_us: NonNegative = 0
    #: Share of device time against the other models on the device when nobody is behind.
    weight: Annotated[float, Field(gt=0)] = 1.0
    #: Requests queued or computing beyond this many are refused at once (429); 0: no limit.
    max_in_flight: NonNegative = 0
    #: Requests per second admitted (a token bucket); beyond it refused at once (429); 0: none.
    rate_limit: Annotated[float, Field(ge=0)] = 0.0
    #: Requests the bucket holds: a burst admitted at once; 0: one second's worth (at least 1).
    rate_burst: NonNegative = 0


#: The prompt prefixes a fleet's router may hash, in bytes (HAProxy 2.6's `bytes` converter
#: takes a constant length, so the router holds one rule per length: scale/prefix.py).
PREFIX_LENGTHS = tuple(2**n for n in range(6, 14))


class RoutingConfig(Strict):
    """How a fleet's router picks a replica for this model's generative requests (docs/scale.md,
    "Routing by prefix and by session"); a single server ignores it."""

    #: least-work: the replica with the least work in flight; prefix: the replica a hash of the
    #: session (x-session-id, else OpenAI's `user`), else of the prompt's first `prefix_bytes`,
    #: points to, bounded by load; session: by the session only, else least work.
    policy: Literal["least-work", "prefix", "session"] = "least-work"
    #: Bytes of the prompt hashed (the system prompt's first bytes, for a chat).
    prefix_bytes: int = 1024

    @field_validator("prefix_bytes")
    @classmethod
    def _a_length_the_router_holds(cls, value: int) -> int:
        if value not in PREFIX_LENGTHS:
            raise ValueError(
                f"prefix_bytes {value}: expected a power of two from {PREFIX_LENGTHS[0]} "
                f"to {PREFIX_LENGTHS[-1]}"
            )
        return value


class MemoryConfig(Strict):
    """A model's place under the server's memory budget (docs/memory.md)."""

    #: Never evicted to make room for another model, when loaded at the server's start.
    pinned: bool = False
    #: The most each device may hold of this model, e.g. {cpu = "512MiB", gpu0 = "4GiB"}: a
    #: load measured above it is refused, and before its first load it is the expected size.
    limit: dict[str, str | Annotated[int, Field(ge=0)]] = {}
