"""What `dlscale serve --ray` was asked for: the cluster, the ports, and how models scale."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import ConfigError


@dataclass(frozen=True)
class ScaleSettings:
    """Settings of one Ray Serve deployment of a repository; picklable, handed to the ingress.

    The repository must be at the same path on every node of the cluster (a shared or copied
    folder), as must an installed dlscale.
    """

    repository: Path
    #: None starts a Ray cluster in this process; "auto" joins the local node's cluster;
    #: "ray://host:10001" connects through Ray Client; "host:6379" joins that head.
    address: str | None = None
    host: str = "127.0.0.1"
    http_port: int = 8000
    #: None turns the gRPC proxy off.
    grpc_port: int | None = 8001
    #: Ray's Prometheus export port of a cluster started here (a joined cluster has its own).
    metrics_port: int | None = 8002
    #: none (deploy all, fixed) or explicit (deploy and delete over the protocol's API).
    model_control: str = "none"
    #: The models deployed at start under explicit control; "*" deploys every one.
    load_models: tuple[str, ...] = ()
    replicas: int = 1
    #: (min, max) replicas for Ray Serve's autoscaler; None keeps `replicas` fixed.
    autoscale: tuple[int, int] | None = None
    #: Overrides of what a replica asks Ray for (by default: from the model's instances).
    cpus_per_replica: float | None = None
    gpus_per_replica: float | None = None
    ingress_replicas: int = 1
    #: The longest a request may take in the cluster, retries included, before a 503.
    request_timeout_s: float = 60.0
    max_body_bytes: int = 64 * 2**20
    max_grpc_message_bytes: int = 64 * 2**20
    #: How often a replica copies its metrics into Ray's metrics export.
    metrics_interval_s: float = 5.0
    #: How often the ingress reads the deployments' states from Ray Serve.
    refresh_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.model_control not in ("none", "explicit"):
            raise ConfigError(
                f"--model-control {self.model_control} is not supported with --ray: use none "
                "(every model, fixed) or explicit (load and unload over the API)"
            )
        if self.replicas < 1 or self.ingress_replicas < 1:
            raise ConfigError("replicas must be at least 1")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high or high < 1:
                raise ConfigError(f"autoscale {low}:{high}: expected 0 <= MIN <= MAX, MAX >= 1")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request timeout must be positive, got {self.request_timeout_s}")


def parse_autoscale(text: str) -> tuple[int, int]:
    """`MIN:MAX` replicas, e.g. `1:8`."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ConfigError(f"autoscale {text!r}: expected MIN:MAX replicas, e.g. 1:8")
    return int(low), int(high)
