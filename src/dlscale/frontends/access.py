"""Restricted API groups, as Triton's `--http-restricted-api` and `--grpc-restricted-protocol`.

A group of APIs (model-repository, statistics, ...) may require a header with a shared value,
so that a deployment exposes inference while keeping its control API to those who hold the key.
Over gRPC the header is `triton-grpc-protocol-<key>`, as Triton names it, so that the same
clients work against both servers.

Once any group is restricted, the trace and logging settings are too (DEFAULT_RESTRICTED), with
the model-repository group's key (else the first restriction's): a deployment that keeps a key
has control to keep, and these settings can fill memory and disk or turn error logs off.
Naming them in a restriction of their own gives them another key.

The server's API key (frontends/api_key.py) is checked first: without it a guarded call is
unauthenticated (401 / UNAUTHENTICATED) whatever restrictions say; with it, a restricted group
still wants its own header (403 / PERMISSION_DENIED).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dlscale.errors import PermissionDenied
from dlscale.frontends.api_key import ApiKey

#: The API groups Triton recognizes, in its words.
API_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
    "openai",  # dlscale's: the OpenAI API's /v1 routes (frontends/rest/openai/)
)
#: Groups restricted by default once any restriction is configured (docs/limits.md).
DEFAULT_RESTRICTED = ("trace", "logging")
#: The prefix Triton puts before a gRPC restriction's key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

_GRPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    # TensorFlow Serving's services (frontends/grpc/tfserving.py)
    "Predict": "inference",
    "Classify": "inference",
    "Regress": "inference",
    "MultiInference": "inference",
    "GetModelMetadata": "metadata",
    "GetModelStatus": "health",
    "HandleReloadConfigRequest": "model-repository",
}


@dataclass(frozen=True)
class Restriction:
    """APIs that answer only requests carrying header `key` with `value`."""

    groups: frozenset[str]
    key: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Restriction:
        """`<api>,<api>,...:<key>=<value>`, Triton's flag syntax."""
        apis, colon, pair = text.partition(":")
        key, equals, value = pair.partition("=")
        groups = frozenset(a.strip() for a in apis.split(",") if a.strip())
        if not colon or not equals or not key.strip() or not groups:
            raise ValueError(f"restricted API {text!r}: expected <api>,<api>,...:<key>=<value>")
        unknown = sorted(groups - set(API_GROUPS))
        if unknown:
            raise ValueError(f"restricted API {text!r}: unknown {unknown}; known: {API_GROUPS}")
        return cls(groups, key.strip().lower(), value)


class Access:
    """Which header each restricted group needs; one group belongs to at most one restriction."""

    def __init__(
        self,
        restrictions: Iterable[Restriction] = (),
        header_prefix: str = "",
        api_key: ApiKey | None = None,
    ) -> None:
        self._by_group: dict[str, Restriction] = {}
        self._prefix = header_prefix
        self.api_key = api_key
        for restriction in restrictions:
            for group in restriction.groups:
                if group in self._by_group:
                    raise ValueError(f"API {group!r} cannot be in several restricted groups")
                self._by_group[group] = restriction
        if self._by_group:
            keeper = self._by_group.get("model-repository") or next(iter(self._by_group.values()))
            for group in DEFAULT_RESTRICTED:
                self._by_group.setdefault(group, keeper)

    def __bool__(self) -> bool:
        return bool(self._by_group) or self.api_key is not None

    def check(self, group: str, headers: Mapping[str, str]) -> None:
        """Unauthenticated without the server's API key where it guards `group`; then
        PermissionDenied unless `group` is open or `headers` (lower-case names) hold its key."""
        if self.api_key is not None and self.api_key.guards(group):
            self.api_key.check(headers)
        restriction = self._by_group.get(group)
        if restriction is None:
            return
        header = self._prefix + restriction.key
        given = headers.get(header)
        # compare_digest: the time taken must not tell how much of the value was right.
        if given is None or not hmac.compare_digest(given.encode(), restriction.value.encode()):
            raise PermissionDenied(
                f"the {group} API is restricted: send the header {header!r} with its value"
            )


def grpc_group(method: str) -> str:
    """The API group of a gRPC method (`/inference.GRPCInferenceService/ModelInfer`)."""
    service, _, name = method.rpartition("/")
    if service.endswith("grpc.health.v1.Health"):
        return "health"
    if "SharedMemory" in name:
        return "shared-memory"
    return _GRPC_GROUPS.get(name, "")
