"""What `dlscale serve` is asked for: small frozen groups, each field with its default and flags.

Each field says once what it is: its default, the help `dlscale serve -h` shows and its flag with
Triton's spelling beside dlscale's. flags.py generates the argparse flags from the fields and
reads them back into the same fields; `ServerSettings.build` fills the groups from flat keywords,
for code and tests. docs/configuration.md lists every flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from dlscale.errors import ConfigError
from dlscale.frontends import GRACE_S
from dlscale.frontends.access import GRPC_HEADER_PREFIX, Access, Restriction
from dlscale.frontends.api_key import SCOPES, ApiKey
from dlscale.frontends.limits import Limits
from dlscale.frontends.tls import TlsFiles
from dlscale.server_settings.fields import boolean as boolean
from dlscale.server_settings.fields import setting as setting
from dlscale.server_settings.generative import Generative as Generative
from dlscale.server_settings.observation import Observation as Observation
from dlscale.serving.control.demand import WAITING_LOADS
from dlscale.serving.control.mode import ModelControl
from dlscale.serving.memory.ledger import PARALLEL
from dlscale.serving.memory.sizes import parse_budget
from dlscale.serving.regions import MAX_REGIONS

#: The bounds of --route-balance-factor: HAProxy wants more than 100 percent, and above 1000
#: the bound no longer bounds what a fleet of a few replicas could see.
BALANCE_FACTORS, DEFAULT_BALANCE_FACTOR = (101, 1000), 150


def _port(value: int) -> int | None:
    """-1 turns a frontend off (None); 0 lets the OS pick a port."""
    if not -1 <= value <= 65_535:
        raise ValueError(f"{value}: expected a port from 0 to 65535 (0: any free one) or -1 (off)")
    return None if value < 0 else value


def _restrictions(texts: list[str]) -> tuple[Restriction, ...]:
    return tuple(Restriction.parse(t) for t in texts)


def _budget(text: str | tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """--memory-budget's text as (device, bytes) pairs (the default is already pairs)."""
    return text if isinstance(text, tuple) else tuple(parse_budget(text).items())


#: A BOOL flag as Triton takes it: `--flag`, `--flag=true`, `--flag false`.
_BOOL: dict[str, Any] = {"type": boolean, "nargs": "?", "const": True, "metavar": "BOOL"}


@dataclass(frozen=True)
class Network:
    """Where the frontends listen; a port of None turns that frontend off, 0 picks one."""

    #: Loopback by default: expose the server on purpose (--host 0.0.0.0), with TLS or a proxy.
    host: str = setting("127.0.0.1", "address to bind (default loopback)", "--host")
    http_port: int | None = setting(
        8000,
        "REST port (OIP and OpenAI); -1 turns it off",
        "--http-port",
        "--port",
        convert=_port,
        type=int,
    )
    grpc_port: int | None = setting(
        8001, "gRPC port; -1 turns it off", "--grpc-port", convert=_port, type=int
    )
    #: TensorFlow Serving's gRPC services beside OIP's; they load TensorFlow (docs/tfserving.md).
    grpc_tfserving: bool = setting(
        False,
        "serve TensorFlow Serving's gRPC API (PredictionService, ModelService) on the gRPC port; "
        "needs tensorflow-serving-api, and loads TensorFlow",
        "--grpc-tfserving",
        **_BOOL,
    )
    metrics_port: int | None = setting(
        8002,
        "Prometheus port; -1 turns it off; no TLS; with --api-key (scope all) a scrape needs "
        "the key, else keep it private",
        "--metrics-port",
        convert=_port,
        type=int,
    )
    #: REST worker processes sharing the port (0: REST on this process); docs/serving-rest.md.
    http_workers: int = setting(
        0,
        "REST in N processes on one port, forwarding to the model process (0: one process)",
        "--http-workers",
        type=int,
    )

    #: One `dlscale serve` per device behind these ports (docs/scale.md); scale/devices.py reads
    #: the SPEC: auto, a count, or a list of devices. None serves in this process.
    device_workers: str | None = setting(
        None,
        "one server process per device behind these ports: auto (each GPU, or each MIG slice), "
        "N processes, or gpu0,gpu1 / GPU-... / MIG-... UUIDs (docs/scale.md)",
        "--device-workers",
        metavar="SPEC",
    )
    #: A fleet's bound on prefix routing: no replica above this percent of the mean load
    #: (HAProxy's hash-balance-factor; docs/scale.md, "Routing by prefix and by session").
    route_balance_factor: int = setting(
        DEFAULT_BALANCE_FACTOR,
        "a fleet (--device-workers, --ray): the most load, in percent of the mean, a replica "
        "takes from prefix or session routing (101-1000)",
        "--route-balance-factor",
        type=int,
        metavar="PERCENT",
    )

    def __post_init__(self) -> None:
        if self.device_workers is not None and not self.device_workers.strip():
            raise ConfigError("--device-workers: auto, a count, or a list of devices")
        low, high = BALANCE_FACTORS
        if not low <= self.route_balance_factor <= high:
            raise ConfigError(
                f"--route-balance-factor {self.route_balance_factor}: expected a percentage of "
                f"the mean load from {low} to {high} (150: no replica above 1.5x the mean)"
            )
        if self.http_workers < 0:
            raise ConfigError(f"--http-workers {self.http_workers}: 0 or more")


@dataclass(frozen=True)
class Models:
    """Which models are served and how they change: model control and device scheduling."""

    model_control: ModelControl = setting(
        ModelControl.NONE,
        "none: load all, no API loads; explicit: load via API; poll: follow the folder; "
        "on-demand: explicit, and a request loads its model (docs/memory.md)",
        "--model-control",
        "--model-control-mode",
        choices=[m.value for m in ModelControl],
    )
    #: The models explicit control loads at start; ALL_MODELS ("*") loads every one.
    load_models: tuple[str, ...] = setting(
        (), "explicit mode: load", "--load-model", convert=tuple, action="append"
    )
    poll_interval_s: float = setting(
        5.0, "poll mode: seconds", "--poll-interval", "--repository-poll-secs", type=float
    )
    #: Bytes of the response cache, for the models whose config enables it (0: no cache).
    cache_bytes: int = setting(
        0,
        "bytes the response cache holds for models with response_cache = true (0: no cache)",
        "--cache-size",
        "--response-cache-byte-size",
        type=int,
    )
    #: False ignores every model's [qos] table: no device scheduler, no limits (docs/qos.md).
    qos: bool = setting(
        True,
        "schedule models sharing a device by their [qos] (default); --no-qos ignores it",
        "--qos",
        action=argparse.BooleanOptionalAction,
    )

    #: Bytes each device may hold of loaded models, by device key (docs/memory.md).
    memory_budget: tuple[tuple[str, int], ...] = setting(
        (),
        "e.g. cpu=8GiB,gpu0=60GiB: loads evict the least recently used idle models to fit, or "
        "are refused (docs/memory.md)",
        "--memory-budget",
        convert=_budget,
        metavar="DEV=SIZE,...",
    )

    max_cold_loads: int = setting(
        WAITING_LOADS,
        "on-demand: cold models that may wait for their load at once; a request for one more "
        "is refused (503)",
        "--max-cold-loads",
        type=int,
    )
    #: Loads that run at once on the host when their sizes are known (docs/memory.md).
    parallel_loads: int = setting(
        PARALLEL,
        "loads at once on the host (default: half its cores, at most 4; a model's first load "
        "runs alone; a GPU's loads take turns)",
        "--parallel-loads",
        type=int,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_control", ModelControl.of(self.model_control))
        if self.max_cold_loads < 1:
            raise ConfigError(f"--max-cold-loads {self.max_cold_loads}: 1 or more")
        if self.parallel_loads < 1:
            raise ConfigError(f"--parallel-loads {self.parallel_loads}: 1 or more")
        if self.cache_bytes < 0:
            raise ConfigError(f"--cache-size {self.cache_bytes}: 0 or more bytes")
        if not self.poll_interval_s > 0:
            raise ConfigError(f"--poll-interval {self.poll_interval_s}: seconds above 0")


@dataclass(frozen=True)
class Lifecycle:
    """Readiness, start-up failures and the shutdown grace, as Triton names them."""

    strict_readiness: bool = setting(
        True, "ready only while every model that should be served is READY", "--strict-readiness",
        **_BOOL,
    )  # fmt: skip
    exit_on_error: bool = setting(
        False, "stop when a model fails to load at start, not serve the others", "--exit-on-error",
        **_BOOL,
    )  # fmt: skip
    #: Requests still running after the grace are answered 503 / UNAVAILABLE.
    grace_s: float = setting(
        GRACE_S,
        "seconds requests in flight get at shutdown; then 503 / UNAVAILABLE",
        "--grace-s",
        "--exit-timeout-secs",
        type=float,
    )

    def __post_init__(self) -> None:
        if not 0 <= self.grace_s < float("inf"):
            raise ConfigError(f"--grace-s {self.grace_s}: seconds, 0 or more")


@dataclass(frozen=True)
class Security:
    """TLS for REST and gRPC, the API key and restricted API groups (docs/limits.md)."""

    tls_cert: Path | None = setting(
        None, "PEM certificate chain: REST and gRPC on TLS", "--tls-cert", type=Path
    )
    tls_key: Path | None = setting(None, "PEM private key of --tls-cert", "--tls-key", type=Path)
    tls_client_ca: Path | None = setting(
        None, "require client certificates it signed", "--tls-client-ca", type=Path
    )
    http_restricted: tuple[Restriction, ...] = setting(
        (),
        "e.g. model-repository,statistics:admin-key=SECRET; repeatable (Triton's syntax)",
        "--http-restricted-api",
        convert=_restrictions,
        action="append",
        metavar="APIS:KEY=VALUE",
    )
    grpc_restricted: tuple[Restriction, ...] = setting(
        (),
        "the same for gRPC; the header is triton-grpc-protocol-KEY",
        "--grpc-restricted-protocol",
        convert=_restrictions,
        action="append",
        metavar="APIS:KEY=VALUE",
    )
    #: vLLM's --api-key, over every route that generates or controls (frontends/api_key.py).
    api_key: str | None = setting(
        None,
        "require 'Authorization: Bearer KEY' (gRPC: metadata 'authorization'), else 401 / "
        "UNAUTHENTICATED; see --api-key-scope (docs/openai.md)",
        "--api-key",
        metavar="KEY",
    )
    api_key_scope: str = setting(
        "all",
        "what --api-key guards; all: every REST and gRPC route and the metrics port, except "
        "/v2/health/*, /v2/models/M/ready and gRPC ServerLive/ServerReady/ModelReady; openai: "
        "the /v1 routes (and trace/logging settings) only",
        "--api-key-scope",
        choices=SCOPES,
    )

    def __post_init__(self) -> None:
        if self.api_key is not None:
            try:
                ApiKey(self.api_key, self.api_key_scope)
            except ValueError as exc:
                raise ConfigError(f"--api-key: {exc}") from None
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        try:  # one group in one restriction only
            Access(self.http_restricted), Access(self.grpc_restricted)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def key(self) -> ApiKey | None:
        """The API key every frontend checks (None: no key asked)."""
        return None if self.api_key is None else ApiKey(self.api_key, self.api_key_scope)

    def http_access(self) -> Access:
        """Who may call what over REST: the API key, then the restricted groups."""
        return Access(self.http_restricted, api_key=self.key)

    def grpc_access(self) -> Access:
        """Who may call what over gRPC: the API key, then the restricted groups (prefixed)."""
        return Access(self.grpc_restricted, GRPC_HEADER_PREFIX, self.key)

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files; None serves plain text (loopback, or behind a proxy that does TLS)."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_client_ca)


@dataclass(frozen=True)
class SharedMemory:
    """Clients' shared-memory regions (docs/shared-memory.md)."""

    allow_client_shm: bool = setting(
        False,
        "let clients register system and CUDA shared-memory regions (off by default)",
        "--allow-client-shm",
        action="store_true",
    )
    max_shm_regions: int = setting(
        MAX_REGIONS, "most shared-memory regions at once", "--max-shm-regions", type=int
    )
    #: Users besides the server's own whose shared-memory objects clients may register.
    shm_owner_uids: tuple[int, ...] = setting(
        (),
        "also take shared-memory objects of this user (default: the server's user only)",
        "--shm-owner-uid",
        convert=tuple,
        type=int,
        action="append",
    )

    def __post_init__(self) -> None:
        if self.max_shm_regions < 1:
            raise ConfigError(f"--max-shm-regions {self.max_shm_regions}: 1 or more")


#: The groups of ServerSettings, by field name, with the title of their flags in -h.
GROUPS: dict[str, tuple[type[Any], str]] = {
    "network": (Network, "network"),
    "models": (Models, "models"),
    "lifecycle": (Lifecycle, "readiness and shutdown"),
    "security": (Security, "TLS and access (docs/limits.md)"),
    "shared_memory": (SharedMemory, "shared memory (docs/shared-memory.md)"),
    "observation": (Observation, "logs and traces"),
    "limits": (Limits, "limits on clients (docs/limits.md)"),
    "generative": (
        Generative,
        "a Hugging Face folder as one model, vLLM's flags (docs/generative.md)",
    ),
}


@dataclass(frozen=True)
class ServerSettings:
    """What `dlscale serve` was asked for: the repository and one small group per concern.

    Every bound on clients is in `limits` (frontends/limits.py documents each); docs/limits.md
    tells what each protects and how to change it.
    """

    repository: Path
    network: Network = field(default_factory=Network)
    models: Models = field(default_factory=Models)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    security: Security = field(default_factory=Security)
    shared_memory: SharedMemory = field(default_factory=SharedMemory)
    observation: Observation = field(default_factory=Observation)
    limits: Limits = field(default_factory=Limits)
    generative: Generative = field(default_factory=Generative)

    @classmethod
    def build(cls, repository: Path, **values: Any) -> ServerSettings:
        """Settings from flat keywords, each given to the group whose field it names."""
        return cls(repository).replace(**values)

    def replace(self, **values: Any) -> Self:
        """A copy with flat keywords changed (`http_port=0`, `max_body_bytes=...`); a group's
        name (`limits=Limits(...)`) replaces that whole group, before its fields are changed."""
        whole = {k: values.pop(k) for k in list(values) if k in GROUPS or k == "repository"}
        by_group: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        for key, value in values.items():
            group = _GROUP_OF.get(key)
            if group is None:
                raise TypeError(f"ServerSettings has no setting {key!r}")
            by_group[group][key] = value
        changed = dataclasses.replace(self, **whole)
        groups = {
            name: dataclasses.replace(getattr(changed, name), **changes)
            for name, changes in by_group.items()
            if changes
        }
        return dataclasses.replace(changed, **groups)


#: Which group holds each field (their names are unique across groups).
_GROUP_OF = {f.name: name for name, (kind, _) in GROUPS.items() for f in dataclasses.fields(kind)}
