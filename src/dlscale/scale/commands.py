"""`dlscale serve REPO --ray`: deploy a repository on Ray Serve and serve until stopped."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import replace

import ray
from ray import serve

from dlscale.errors import ConfigError, DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.scale import deploy
from dlscale.scale.ingress import deploy_ingress
from dlscale.scale.placement import fit_cpus, placement_of
from dlscale.scale.settings import ScaleSettings, ray_values
from dlscale.server import ALL_MODELS
from dlscale.server import settings_from as server_settings_from

log = logging.getLogger("dlscale.scale")


def settings_from(args: argparse.Namespace) -> ScaleSettings:
    """The parsed `dlscale serve` flags as ScaleSettings."""
    server = server_settings_from(args)
    if server.shared_memory.allow_client_shm:
        raise ConfigError(
            "--allow-client-shm is not available with --ray: a client's shared-memory region is "
            "in its own host's memory, which the replicas on other hosts cannot read"
        )
    if server.network.http_workers:
        raise ConfigError(
            "--http-workers is not available with --ray: Ray's proxy serves HTTP "
            "(--ingress-replicas adds ingress replicas)"
        )
    if server.security.api_key is not None:  # the ingress checks no key: refused, not ignored
        raise ConfigError(
            "--api-key is not available with --ray: put an authenticating proxy in front"
        )
    network, models = server.network, server.models
    return ScaleSettings(
        repository=server.repository.resolve(),
        host=network.host,
        # -1 is passed on as it was given: Ray's proxy always serves HTTP.
        http_port=-1 if network.http_port is None else network.http_port,
        grpc_port=network.grpc_port,
        metrics_port=network.metrics_port,
        model_control=models.model_control,
        load_models=models.load_models,
        max_body_bytes=server.limits.max_body_bytes,
        max_grpc_message_bytes=server.limits.max_grpc_message_bytes,
        **ray_values(args),
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
        ray.init(address=settings.address, logging_level=logging.WARNING)
        return
    ray.init(
        logging_level=logging.WARNING,
        _metrics_export_port=settings.metrics_port,
    )


def fit_to_cluster(settings: ScaleSettings, names: list[str]) -> ScaleSettings:
    """The settings with each replica's CPU ask shrunk to fit the cluster, or a ConfigError
    with the arithmetic when --cpus-per-replica fixes asks that do not fit."""
    repository = ModelRepository(settings.repository)
    asks = {}
    for name in names:
        try:
            config = repository.source(name).config
            asks[name] = placement_of(config, settings.cpus_per_replica).num_cpus
        except DlscaleError:
            continue  # its deployment says why
    replicas = settings.autoscale[0] if settings.autoscale else settings.replicas
    cluster = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
    fixed = settings.cpus_per_replica is not None
    share, arithmetic = fit_cpus(asks, replicas, cluster, fixed)
    if share < 1.0:
        log.info("replicas ask %.3g of the CPUs they would ask: %s", share, arithmetic)
    return replace(settings, cpu_share=share)


def deploy_repository(settings: ScaleSettings) -> list[str]:
    """Start Serve and the ingress (live at once), then deploy the models; returns those
    deployed."""
    deploy.start_serve(settings)
    names = models_to_deploy(settings)
    settings = fit_to_cluster(settings, names)
    failed = unservable(settings, names)  # said in the index at once; no application made
    pending = tuple(n for n in names if n not in failed)
    deploy_ingress(settings, failed, pending)
    host = settings.host
    log.info("http listening on %s:%d (Ray Serve's proxy)", host, settings.http_port)
    if settings.grpc_port is not None:
        log.info("grpc listening on %s:%d (Ray Serve's proxy)", host, settings.grpc_port)
    failed.update(deploy.deploy_models(settings, list(pending)))
    log.info("server ready: %d model(s) deployed, %d failed", len(names) - len(failed), len(failed))
    return [n for n in names if n not in failed]


def unservable(settings: ScaleSettings, names: list[str]) -> dict[str, str]:
    """The models whose config or files fail before any deployment, and why."""
    repository = ModelRepository(settings.repository)
    failed = {}
    for name in names:
        try:
            repository.versions(name, repository.source(name))
        except DlscaleError as exc:
            log.error("model %s: %s", name, exc)
            failed[name] = str(exc)
    return failed


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
        deployed = deploy_repository(settings)
        if args.detach:
            log.info("detached: the deployments keep serving on the cluster (`serve shutdown`)")
            return 0
        _wait_for_signal()
        log.info("stopping: deleting the deployments (requests in flight finish)")
        deploy.undeploy(deployed)
        if settings.address is None:
            serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
        ray.shutdown()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
