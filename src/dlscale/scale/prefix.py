"""Routing generative requests by prefix and by session: HAProxy's rules, and what feeds them.

A model whose config.toml says `[routing] policy = "prefix"` (or "session") has its generative
requests (OpenAI's /v1/chat/completions and /v1/completions, OIP's generate and generate_stream)
sent by a consistent hash with bounded loads instead of leastconn: requests of one tenant (the
same system prompt) or one session reach the replica whose engine already holds that prefix's
KV blocks, and no replica takes more than `balance_factor` percent of the mean load. Everything
else (tensors, other models, a body HAProxy cannot read) keeps the weighted leastconn.
gRPC calls name their model inside a protobuf body, which HAProxy does not read: a gRPC call
that carries a session (the `x-session-id` metadata) is hashed by it, whatever its model, and
every other keeps the weighted leastconn.
The HAProxy features relied on, all in 2.6's configuration.txt: `http-request wait-for-body`
(4.2), `json_query` and `bytes` (7.3.1), `balance hash` with `hash-type consistent` and
`hash-balance-factor` (4.2); docs/scale.md, "Routing by prefix and by session".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dlscale.errors import DlscaleError
from dlscale.models.config_sections import PREFIX_LENGTHS, RoutingConfig
from dlscale.models.repository import ModelRepository
from dlscale.models.sources import read_source
from dlscale.scale import finish
from dlscale.scale.weights import MAX_WEIGHT
from dlscale.server_settings import DEFAULT_BALANCE_FACTOR, ServerSettings

log = logging.getLogger("dlscale.scale")
#: The backends of hashed requests, REST and gRPC (their servers track the REST backend's: one
#: meaning of "up").
HASHED, GRPC_HASHED = "rest_hashed", "grpc_hashed"
#: A client's session: requests carrying the same value reach the same replica.
SESSION_HEADER = "x-session-id"
#: What `session` routes by: no prompt length matches, so only a session sets the key.
SESSION_ONLY = 0
#: The generative routes (OpenAI's by path; OIP's by pattern, with the model in it).
_OPENAI_PATHS = "/v1/chat/completions /v1/completions"
_OIP_GENERATE = r"^/v2/models/[^/]+(/versions/[0-9]+)?/generate(_stream)?$"
#: Seconds HAProxy waits for a generative request's body (or a full buffer) before routing it
#: by least work: a slow client is not held, it only loses its affinity.
BODY_WAIT = "1s"
#: The REST frontend's key of a hashed request (`frontend_rules` sets it).
_KEY = "var(txn.dls_key)"


@dataclass(frozen=True)
class Routing:
    """What the router is told about prefix routing: the bound, and each model's key length
    (SESSION_ONLY for `session`; a model not named routes by least work)."""

    #: Checked where it is asked for (server_settings' --route-balance-factor).
    balance_factor: int = DEFAULT_BALANCE_FACTOR
    routes: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: ServerSettings) -> Routing:
        """The routing a fleet of `settings` asks for: its bound, its repository's models."""
        return cls(settings.network.route_balance_factor, routes_of(settings.repository))


def route_of(config: RoutingConfig) -> int | None:
    """The map's value for a model's routing: its prefix length, SESSION_ONLY, or None."""
    if config.policy == "prefix":
        return config.prefix_bytes
    return SESSION_ONLY if config.policy == "session" else None


def routes_of(repository: Path) -> dict[str, int]:
    """Each model of the repository that routes by prefix or session, with its map value; a
    model whose config cannot be read routes by least work (its load says why)."""
    found: dict[str, int] = {}
    repo = ModelRepository(repository)
    for name in repo.names():
        try:
            # Read quietly (not repo.config): a poll-mode fleet reads it again and again, and
            # the workers already log what a peer's config holds that is ignored.
            value = route_of(read_source(repo.root / name, name).config.routing)
        except DlscaleError as exc:
            log.debug("routing of %s: least work (%s)", name, exc)
            continue
        if value is not None:
            found[name] = value
    return found


def write_map(path: Path, routes: Mapping[str, int]) -> None:
    """HAProxy's map file of model name -> key length, read at its start."""
    path.write_text("".join(f"{name} {value}\n" for name, value in sorted(routes.items())))


def map_commands(path: Path, now: Mapping[str, int], wanted: Mapping[str, int]) -> list[str]:
    """The runtime-API commands turning the map from `now` into `wanted`."""
    gone = {name: None for name in now if name not in wanted}
    return finish.map_commands(path, now, {**gone, **wanted})


def frontend_rules(map_path: Path) -> list[str]:
    """The REST frontend's rules: the key of a generative request of a model that routes by
    prefix or session, and the hashed backend for a request that has one."""
    chat, text = "{ path /v1/chat/completions }", "var(txn.dls_text)"
    return [
        f"  acl dls_openai path {_OPENAI_PATHS}",
        f"  acl dls_generate path_reg '{_OIP_GENERATE}'",
        f"  http-request wait-for-body time {BODY_WAIT} if METH_POST dls_openai || "
        "METH_POST dls_generate",
        # The model: OpenAI's body names it; OIP's path does.
        "  http-request set-var(txn.dls_model) req.body,json_query('$.model') if dls_openai",
        "  http-request set-var(txn.dls_model) path,field(4,/) if dls_generate",
        f"  http-request set-var(txn.dls_len) var(txn.dls_model),map({map_path})",
        "  acl dls_routed var(txn.dls_len) -m found",
        # The prompt's first text: a chat's first message (a string, or its first part).
        *_text_rules(chat),
        *(
            f"  http-request set-var(txn.dls_key) {text},bytes(0,{n}) "
            f"if {{ var(txn.dls_len) -m int {n} }}"
            for n in PREFIX_LENGTHS
        ),
        # A session outranks the prompt: OpenAI's `user`, then the header, the last word.
        "  http-request set-var(txn.dls_key,ifnotempty) req.body,json_query('$.user') "
        "if dls_openai dls_routed",
        f"  http-request set-var(txn.dls_key,ifnotempty) req.hdr({SESSION_HEADER}) if dls_routed",
        f"  use_backend {HASHED} if {{ {_KEY} -m found }}",
    ]


def _text_rules(chat: str) -> list[str]:
    pick = "  http-request set-var(txn.dls_text,ifnotempty) req.body,json_query('{}') if {}"
    unset = "!{ var(txn.dls_text) -m found }"
    return [
        pick.format("$.messages[0].content", f"dls_routed {chat}"),
        pick.format("$.messages[0].content[0].text", f"dls_routed {chat} {unset}"),
        pick.format("$.prompt", "dls_routed { path /v1/completions }"),
        pick.format("$.prompt[0]", f"dls_routed {{ path /v1/completions }} {unset}"),
        pick.format("$.text_input", "dls_routed dls_generate"),
    ]


def grpc_frontend_rules() -> list[str]:
    """The gRPC frontend's rule: a call carrying a session goes to the hashed backend."""
    return [f"  use_backend {GRPC_HASHED} if {{ req.hdr({SESSION_HEADER}) -m found }}"]


def backend(
    balance_factor: int, slots: Iterable[int], tracked: str, maxconn: int, *, grpc: bool = False
) -> list[str]:
    """A hashed backend (REST's, or gRPC's with `grpc`): consistent hashing on the key, bounded
    by `balance_factor`; its servers follow the REST backend's (`tracked`) health and each takes
    `maxconn` requests at once."""
    name, key = (GRPC_HASHED, f"req.hdr({SESSION_HEADER})") if grpc else (HASHED, _KEY)
    return [
        f"backend {name}",
        f"  default-server maxconn {maxconn}",
        f"  balance hash {key}",
        # Consistent: a replica that leaves moves its own keys only; the others keep theirs.
        "  hash-type consistent",
        f"  hash-balance-factor {balance_factor}",
        "  http-reuse always",
        # The most weight, the same for all: each server's share of the ring is 16 points per
        # unit of weight, and 16 points leave a replica's arcs uneven by tens of percent.
        *(
            f"  server r{i} 127.0.0.1:9 disabled weight {MAX_WEIGHT}"
            f"{' proto h2' if grpc else ''} track {tracked}/r{i}"
            for i in slots
        ),
    ]
