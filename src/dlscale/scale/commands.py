"""`dlscale serve REPO --ray`: a fleet of whole servers on a Ray cluster, behind one router."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
from dataclasses import replace

import ray

from dlscale.errors import ConfigError, DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.scale import deploy
from dlscale.scale.placement import Placement, fit_cpus, placement_of, readable_configs
from dlscale.scale.settings import BOTH_FLEETS, ScaleSettings
from dlscale.server import ALL_MODELS
from dlscale.server import settings_from as server_settings_from
from dlscale.server_settings.flags import flag_values

log = logging.getLogger("dlscale.scale")


def settings_from(args: argparse.Namespace) -> ScaleSettings:
    """The parsed `dlscale serve` flags as ScaleSettings (each replica's server from the same
    flags, on ports of its own)."""
    server = server_settings_from(args)
    if server.network.device_workers is not None:
        raise ConfigError(BOTH_FLEETS)
    if server.shared_memory.allow_client_shm:
        raise ConfigError(
            "--allow-client-shm is not available with --ray: a client's shared-memory region is "
            "in its own host's memory, which the replicas on other hosts cannot read"
        )
    if server.network.http_workers:
        raise ConfigError(
            "--http-workers is not available with --ray: add replicas instead (--replicas N)"
        )
    if server.security.api_key is not None:  # the router and its control endpoint check none
        raise ConfigError(
            "--api-key is not available with --ray: put an authenticating proxy in front"
        )
    network, models = server.network, server.models
    if args.autoscale is not None and network.metrics_port is None:
        raise ConfigError(
            "--autoscale needs the replicas' metrics (their requests in flight): drop "
            "--metrics-port -1"
        )
    if network.http_port is None:
        raise ConfigError("--http-port -1 is not available with --ray: the router serves REST")
    replica_server = server.replace(
        repository=server.repository.resolve(),
        http_port=0,
        grpc_port=None if network.grpc_port is None else 0,
        metrics_port=None if network.metrics_port is None else 0,
        # A replica is routed to while it is ready: one model that fails to load must not take
        # every replica out of rotation (the index says which failed, and why).
        strict_readiness=False,
    )
    return ScaleSettings(
        repository=server.repository.resolve(),
        host=network.host,
        http_port=network.http_port,
        grpc_port=network.grpc_port,
        metrics_port=network.metrics_port,
        model_control=models.model_control,
        load_models=models.load_models,
        server=replica_server,
        **flag_values(ScaleSettings, args),
    )


def models_to_deploy(settings: ScaleSettings) -> list[str]:
    """Every model under --model-control none or with --load-model '*', else those named."""
    names = ModelRepository(settings.repository).names()
    if settings.model_control.loads_named and ALL_MODELS not in settings.load_models:
        return list(settings.load_models)
    return names


def connect(settings: ScaleSettings) -> None:
    """Join the cluster at `address`, or start one in this process (ended with it)."""
    if settings.address is not None:
        try:
            ray.init(address=settings.address, logging_level=logging.WARNING)
        except ConnectionError as exc:
            # Ray's reason (a token missing, a refused connection) ends its cause's text, which
            # holds a traceback of its own: the user gets that last line, not two tracebacks.
            said = str(exc.__cause__ or exc).strip().splitlines()
            raise ConfigError(
                f"cannot join the Ray cluster at {settings.address}: {said[-1] if said else exc}"
            ) from None
        return
    # "local": a cluster of this command's own. Without an address ray.init joins the cluster
    # that `ray start` last recorded on this host (or RAY_ADDRESS), which is another's to run.
    ray.init(address="local", logging_level=logging.WARNING, include_dashboard=False)


def placements(settings: ScaleSettings, names: list[str]) -> dict[str, Placement]:
    """What each model's instances ask for (a model whose config fails is left to its replica's
    server to report)."""
    found = {}
    for name, config in readable_configs(settings.repository, names).items():
        with contextlib.suppress(DlscaleError):
            found[name] = placement_of(config)
    return found


def replica_placement(settings: ScaleSettings, names: list[str]) -> Placement:
    """What one replica asks Ray for: its models' CPUs added up, the most GPUs one of them
    names, a MIG instance if one names it; --cpus/--gpus-per-replica override."""
    asked = placements(settings, names).values()
    migs = {k for p in asked for k in p.resources}
    if len(migs) > 1:
        raise ConfigError(
            f"the models name MIG instances {sorted(migs)}: a replica is one process, and CUDA "
            "shows a process one MIG instance; serve them from separate repositories"
        )
    cpus = sum(p.num_cpus for p in asked)
    if settings.cpus_per_replica is not None:
        cpus = settings.cpus_per_replica
    gpus = max((p.num_gpus for p in asked), default=0.0)
    if settings.gpus_per_replica is not None:
        gpus = settings.gpus_per_replica
    env = {k: v for p in asked for k, v in p.env.items()}
    return Placement(cpus * settings.cpu_share, gpus, dict.fromkeys(migs, 1.0), env)


def autoscale_target(settings: ScaleSettings, names: list[str]) -> float:
    """Requests in flight per replica the autoscaler aims at: a full batch per instance of
    every model the replica serves."""
    configs = readable_configs(settings.repository, names).values()
    total = sum(sum(g.count for g in c.instances) * max(1, c.max_batch_size) for c in configs)
    return float(max(1, total))


def fit_to_cluster(settings: ScaleSettings, names: list[str]) -> ScaleSettings:
    """The settings with each replica's CPU ask shrunk to fit the cluster, or a ConfigError
    with the arithmetic when --cpus-per-replica fixes an ask that does not fit."""
    fixed = settings.cpus_per_replica is not None
    if fixed:
        asks = {"each replica": float(settings.cpus_per_replica or 0.0)}
    else:
        asks = {name: p.num_cpus for name, p in placements(settings, names).items()}
    replicas = settings.autoscale[0] if settings.autoscale else settings.replicas
    cluster = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
    share, arithmetic = fit_cpus(asks, replicas, cluster, fixed)
    if share < 1.0:
        log.info("replicas ask %.3g of the CPUs they would ask: %s", share, arithmetic)
    return replace(settings, cpu_share=share)


def deploy_fleet(settings: ScaleSettings) -> object:
    """Start the router (live at once), then the replicas; returns the router actor."""
    deploy.start_serve()
    router, ports = deploy.start_router(settings)
    for name, port in ports.items():
        whose = "every replica's" if name == "metrics" else "the fleet's router"
        log.info("%s listening on %s:%d (%s)", name, settings.host, port, whose)
    names = models_to_deploy(settings)
    settings = fit_to_cluster(settings, names)
    placement = replica_placement(settings, names)
    deploy.deploy_replicas(settings, placement, autoscale_target(settings, names))
    log.info("server ready: %d replica(s) of %d model(s)", settings.replicas, len(names))
    return router


def serve_on_ray(args: argparse.Namespace) -> int:
    """`dlscale serve REPO --ray`: deploy, then serve until SIGINT or SIGTERM (or return)."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_from(args)
    if args.detach and settings.address is None:
        raise ConfigError(
            "--detach needs --address: a Ray cluster started by this command ends with it"
        )
    connect(settings)
    try:
        router = deploy_fleet(settings)
        if args.detach:
            log.info("detached: the fleet keeps serving on the cluster (`serve shutdown`)")
            return 0
        _wait_for_signal()
        log.info("stopping: deleting the replicas (requests in flight finish)")
        deploy.undeploy(router)
    finally:
        ray.shutdown()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
