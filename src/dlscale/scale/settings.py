"""What `dlscale serve --ray` was asked for: the cluster, the router's ports, the replicas."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import ConfigError
from dlscale.scale.objective import DOWN_DELAY_S
from dlscale.server_settings import ServerSettings, setting
from dlscale.server_settings.flags import Dispatch, add_flag, flagged
from dlscale.serving.control.mode import ModelControl

#: The model control modes a Ray deployment follows (it does not watch a folder).
RAY_MODES = (ModelControl.NONE, ModelControl.EXPLICIT)


def parse_autoscale(text: str) -> tuple[int, int]:
    """`MIN:MAX` replicas, e.g. `1:8`."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ConfigError(f"autoscale {text!r}: expected MIN:MAX replicas, e.g. 1:8")
    return int(low), int(high)


@dataclass(frozen=True)
class ScaleSettings:
    """Settings of one fleet on Ray: where its router listens, how many replicas, and what each
    replica's server is given (`server`); picklable.

    The repository must be at the same path on every node of the cluster (a shared or copied
    folder), as must an installed dlscale.
    """

    repository: Path
    #: None starts a Ray cluster in this process; "auto" joins the local node's cluster;
    #: "ray://host:10001" connects through Ray Client; "host:6379" joins that head.
    address: str | None = setting(
        None, "Ray cluster: auto, HOST:6379 or ray://HOST:10001", "--address"
    )
    #: Where the router (HAProxy) listens: the node of this address runs it.
    host: str = "127.0.0.1"
    http_port: int = 8000
    #: None turns gRPC off (in the router and the replicas).
    grpc_port: int | None = 8001
    #: The fleet's metrics page (every replica's, labelled) and its view; None turns it off.
    metrics_port: int | None = 8002
    #: none (deploy all, fixed) or explicit (deploy and delete over the protocol's API).
    model_control: ModelControl = ModelControl.NONE
    #: The models deployed at start under explicit control; "*" deploys every one.
    load_models: tuple[str, ...] = ()
    replicas: int = setting(
        1, "replicas (each serves the whole repository)", "--replicas", type=int
    )
    #: (min, max) replicas for Ray Serve's autoscaler; None keeps `replicas` fixed.
    autoscale: tuple[int, int] | None = setting(
        None, "autoscale the replicas", "--autoscale", metavar="MIN:MAX",
        convert=lambda text: None if text is None else parse_autoscale(text),
    )  # fmt: skip
    #: The most seconds the autoscaler must want fewer replicas, without a break, before it
    #: steps down (scale/starts.py holds less when replicas start fast).
    scale_down_delay_s: float = setting(
        DOWN_DELAY_S,
        "with --autoscale: the most seconds of wanting fewer replicas before they go (held "
        "three times a replica's measured return: Ray's 5 s look-back and its start)",
        "--scale-down-delay", type=float,
    )  # fmt: skip
    #: Overrides of what a replica asks Ray for (by default: the sum of its models' instances).
    cpus_per_replica: float | None = setting(
        None, "default: one per CPU instance of every model", "--cpus-per-replica", type=float
    )
    gpus_per_replica: float | None = setting(
        None, "e.g. 0.5 to share a GPU", "--gpus-per-replica", type=float
    )
    #: The share of its CPU ask each replica gets, so that all fit the cluster (scale/placement.py
    #: fit_cpus); 1.0 unless they would not fit.
    cpu_share: float = 1.0
    #: What each replica's server is given (its host and ports are set where it runs); None
    #: for the defaults.
    server: ServerSettings | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_control", ModelControl.of(self.model_control))
        if self.model_control not in RAY_MODES:
            raise ConfigError(
                f"--model-control {self.model_control} is not supported with --ray: use none "
                "(every model, fixed) or explicit (load and unload over the API)"
            )
        if self.replicas < 1:
            raise ConfigError("replicas must be at least 1")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 1 <= low <= high:
                # Requests do not pass through Ray: nothing would wake a fleet at zero.
                raise ConfigError(f"autoscale {low}:{high}: expected 1 <= MIN <= MAX")
        if not self.scale_down_delay_s >= 0:
            raise ConfigError(
                f"--scale-down-delay {self.scale_down_delay_s}: expected seconds >= 0"
            )
        # Ray refuses a negative ask only when the deployment starts, in its own words.
        if self.cpus_per_replica is not None and not self.cpus_per_replica >= 0:
            raise ConfigError(f"--cpus-per-replica {self.cpus_per_replica}: expected CPUs >= 0")
        if self.gpus_per_replica is not None and not self.gpus_per_replica >= 0:
            raise ConfigError(f"--gpus-per-replica {self.gpus_per_replica}: expected GPUs >= 0")


#: The one message for --ray beside --device-workers, whichever came first.
BOTH_FLEETS = (
    "--device-workers is not for --ray: Ray places each replica on its node's devices "
    "(--gpus-per-replica); --device-workers is one host's fleet without Ray"
)


def add_ray_flags(serve: argparse.ArgumentParser, handler: object) -> list[argparse.Action]:
    """`dlscale serve REPO --ray ...` (docs/scale.md): `handler` runs the verb with --ray.

    Returns the flags that only --ray reads."""
    ray = serve.add_argument_group("Ray Serve (the [ray] extra)")
    ray.add_argument(
        "--ray",
        action=Dispatch,
        nargs=0,
        default=False,
        handler=handler,
        help="serve on a Ray cluster: replicas of the whole server behind one router",
    )
    only_ray = [add_flag(ray, item) for item in flagged(ScaleSettings)]
    detach = "return once deployed (with --address)"
    return [*only_ray, ray.add_argument("--detach", action="store_true", help=detach)]
