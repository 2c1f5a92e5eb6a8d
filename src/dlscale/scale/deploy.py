"""A fleet on Ray: its router actor, and its replicas as one Ray Serve deployment.

The router actor (router_actor.py) is started first, on the node of `--host`: the replicas tell
it where they listen. The replicas (fleet.py) are one deployment of application `dlscale`, with
no HTTP route: Ray Serve places, health-checks, restarts, scales and rolls them out, and its own
proxies are turned off (no request goes through Ray).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Any

import ray
from ray import serve
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dlscale.errors import ConfigError, DlscaleError
from dlscale.scale.autoscale import autoscaling_config
from dlscale.scale.connections import ConnectionRules
from dlscale.scale.placement import Placement
from dlscale.scale.prefix import Routing, routes_of
from dlscale.scale.registry import HAND_OVER_MAX_S
from dlscale.scale.router_actor import ROUTER_NAME, ROUTER_NAMESPACE, FleetRouter
from dlscale.scale.settings import ScaleSettings

log = logging.getLogger("dlscale.scale")

APP, DEPLOYMENT = "dlscale", "FleetReplica"
#: Per-request access logs of Ray Serve: none pass through it, but its own stay quiet.
QUIET = {"enable_access_log": False, "log_level": "WARNING"}
#: Seconds between Ray Serve's health checks of a replica, and how long one may take.
HEALTH_CHECK_S, HEALTH_TIMEOUT_S = 1.0, 30.0
#: Seconds a stopping replica's child gets to finish its requests.
GRACE_S = 30.0
#: Seconds the router actor gets to start HAProxy.
ROUTER_START_S = 120.0


def start_serve() -> None:
    """Start Ray Serve's controller, its proxies off: the router is HAProxy."""
    serve.start(proxy_location="Disabled", logging_config=QUIET)


def _router_node(host: str) -> str:
    """The node that has `host` (the driver's node for loopback or a wildcard address)."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("Alive") and node.get("NodeManagerAddress") == host:
            return str(node["NodeID"])
    return ray.get_runtime_context().get_node_id()


def start_router(settings: ScaleSettings) -> tuple[Any, dict[str, int]]:
    """The fleet's router actor (the running one if a fleet is deployed); its ports."""
    strategy = NodeAffinitySchedulingStrategy(_router_node(settings.host), soft=False)
    routing = routing_of(settings)
    actor: Any = (
        ray.remote(FleetRouter)
        .options(
            name=ROUTER_NAME,
            namespace=ROUTER_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            # Replicas call it from many threads; HAProxy's runtime API answers quickly.
            max_concurrency=64,
            num_cpus=0,
            scheduling_strategy=strategy,
        )
        .remote(
            settings.host,
            settings.http_port,
            settings.grpc_port,
            settings.metrics_port,
            routing,
            ConnectionRules.of(settings.server),
        )
    )
    try:
        ports: dict[str, int] = ray.get(actor.ports.remote(), timeout=ROUTER_START_S)
        # A running router keeps the arguments it started with: a new deploy's routed models
        # reach it here (its bound needs a new router: `dlscale serve --ray` after a delete).
        ray.get(actor.route.remote(dict(routing.routes)), timeout=ROUTER_START_S)
    except ray.exceptions.RayActorError as exc:
        raise DlscaleError(f"the fleet's router did not start: {exc}") from None
    return actor, ports


def routing_of(settings: ScaleSettings) -> Routing:
    """The router's prefix routing: the replicas' bound, the repository's routed models."""
    if settings.server is not None:
        return Routing.of(settings.server)
    return Routing(routes=routes_of(settings.repository))


def replica_options(settings: ScaleSettings, placement: Placement, target: float) -> dict[str, Any]:
    """Ray Serve deployment options of the replicas: count (or autoscaling to `target`
    requests in flight per replica), resources, health checks."""
    actor = placement.actor_options()
    env = actor.setdefault("runtime_env", {}).setdefault("env_vars", {})
    # Ray Serve starts a replica's pusher of its own figures (record_autoscaling_stats) when
    # the replica starts autoscaled, or on a later switch to autoscaling only where replicas
    # (not handles) report: no request passes a handle here, so they must. (A switch replaces
    # the replicas now, `replica_version`; in place, `--replicas 1` then `--autoscale 1:2`
    # never scaled without this.)
    env["RAY_SERVE_COLLECT_AUTOSCALING_METRICS_ON_HANDLE"] = "0"
    options: dict[str, Any] = {
        "name": DEPLOYMENT,
        "ray_actor_options": actor,
        "health_check_period_s": HEALTH_CHECK_S,
        "health_check_timeout_s": HEALTH_TIMEOUT_S,
        # A last replica may first wait for its successor (HAND_OVER_MAX_S), then drain its child.
        "graceful_shutdown_timeout_s": HAND_OVER_MAX_S + GRACE_S + 10.0,
        "logging_config": QUIET,
    }
    if settings.autoscale is not None:
        options["autoscaling_config"] = autoscaling_config(
            *settings.autoscale, target, settings.scale_down_delay_s,
            (ROUTER_NAME, ROUTER_NAMESPACE),
        )  # fmt: skip
    else:
        options["num_replicas"] = settings.replicas
    return options


def replica_version(settings: ScaleSettings, placement: Placement) -> str:
    """What a replica is: its server's settings, its resources and whether it is autoscaled
    (not how many there are, nor the autoscaler's bounds).

    Ray 2.60 keeps a replica that an autoscaled fleet redeployed fixed runs, and that replica's
    pusher of its figures then fails every second (`assert self._autoscaling_config is not
    None`, logged on every driver; ray-project/ray#62122 is the same pusher at a fixed start):
    a switch between autoscaled and fixed replaces the replicas instead."""
    what = repr((settings.server, placement, settings.autoscale is not None))
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def deploy_replicas(settings: ScaleSettings, placement: Placement, target: float) -> None:
    """Deploy (or update in place: Ray rolls the replicas) the fleet's replicas; returns once
    they serve."""
    from dlscale.scale.fleet import FleetReplica

    assert settings.server is not None
    deployment = serve.deployment(**replica_options(settings, placement, target))(FleetReplica)
    # Ray 2.60 took `version` out of the public options: without one, `serve.run` gives each
    # deploy a random version (serve/_private/client.py) and replaces every running replica,
    # so a new --replicas would restart the fleet. With the same version a new count only adds
    # or removes replicas (pinned Ray; test_ray_replicas.py checks the running one is kept).
    version = replica_version(settings, placement)
    deployment = deployment.options(version=version, _internal=True)
    try:
        serve.run(deployment.bind(settings.server), name=APP, route_prefix=None)
    except RuntimeError as exc:  # serve.run's report of a deployment that failed
        raise ConfigError(f"the replicas failed to deploy on Ray Serve: {exc}") from None
    if settings.autoscale is None:
        log.info("replicas: %d deployed", settings.replicas)
    else:
        low, high = settings.autoscale
        log.info("replicas: autoscaling %d..%d, %g requests in flight each", low, high, target)


def undeploy(router: Any) -> None:
    """Delete the replicas (they finish their requests), then stop the router."""
    # The last replica waits for no successor (a router that did not hear it: HAND_OVER_S).
    with contextlib.suppress(GetTimeoutError, RayActorError):
        ray.get(router.closing.remote(), timeout=30)
    serve.delete(APP)
    try:
        ray.get(router.stop.remote(), timeout=30)
    except (GetTimeoutError, RayActorError) as exc:  # killed below all the same
        log.warning("the router did not stop in 30 s (%s): killing it", type(exc).__name__)
    finally:
        ray.kill(router)
