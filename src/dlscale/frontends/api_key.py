"""The server's API key (`--api-key`): who may call at all, before any restricted group.

As vLLM's `--api-key`, the key travels as `Authorization: Bearer KEY` (the `openai` client's
`api_key=`, tritonclient's `headers=`, gRPC metadata of the same name). In scope `all` (the
default) it guards every REST and gRPC route and the metrics port except health and readiness,
which orchestrators probe without a key; in scope `openai` only the `/v1` routes and the trace
and logging settings, as before the scope existed. docs/openai.md tells what it covers.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dlscale.errors import Unauthenticated

#: What the key guards: every route but health ("all"), or the OpenAI API ("openai").
SCOPES = ("all", "openai")
#: The pseudo group of the metrics port (not an API group of Triton's).
METRICS = "metrics"
#: The groups scope "openai" guards: the API, and settings that can fill a disk or hide logs.
_OPENAI_GROUPS = frozenset({"openai", "trace", "logging"})
#: The groups no scope guards: liveness and readiness probes.
_OPEN_GROUPS = frozenset({"health"})
HEADER = "authorization"
_MISSING = (
    "this server requires an API key: send the header 'Authorization: Bearer <key>' "
    "(no Authorization header was sent)"
)
_NOT_BEARER = "the Authorization header must be 'Bearer <key>'; it has another form"
_WRONG = "the API key sent in 'Authorization: Bearer <key>' is not this server's key"


@dataclass(frozen=True)
class ApiKey:
    """A shared key every guarded call must carry as `Authorization: Bearer KEY`."""

    value: str
    scope: str = "all"

    def __post_init__(self) -> None:
        if not self.value:
            raise ValueError("an API key cannot be empty")
        if self.scope not in SCOPES:
            raise ValueError(f"API key scope {self.scope!r}: expected one of {SCOPES}")

    def guards(self, group: str) -> bool:
        """Whether calls of API `group` need the key ('' is a route of no known group)."""
        if self.scope == "openai":
            return group in _OPENAI_GROUPS
        return group not in _OPEN_GROUPS

    def check(self, headers: Mapping[str, str]) -> None:
        """Unauthenticated unless `headers` (lower-case names) carry the key; the message says
        whether the key was missing, malformed or wrong, never what the right one is."""
        given = headers.get(HEADER)
        if given is None:
            raise Unauthenticated(_MISSING)
        scheme, _, token = given.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise Unauthenticated(_NOT_BEARER)
        # compare_digest: the time taken must not tell how much of the key was right.
        if not hmac.compare_digest(token.strip().encode(), self.value.encode()):
            raise Unauthenticated(_WRONG)


def metrics_guard(key: ApiKey | None) -> Callable[[Mapping[str, str]], None] | None:
    """The key's check on scrapes of a metrics page, where its scope covers the metrics port."""
    return key.check if key is not None and key.guards(METRICS) else None
