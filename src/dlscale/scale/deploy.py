"""Ray Serve applications of a repository: one per model (the ingress's is in ingress.py).

Each model is its own application (`dlscale-model-<name>`, no HTTP route), so that it is
deployed, scaled and deleted on its own; the ingress (`dlscale`, route `/`) is the only
application the HTTP and gRPC proxies route to. Both the command line and the ingress's router
(for the repository API's load and unload) deploy models through these functions; this module
imports neither, so that the router may import it without a circle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from ray import serve
from ray.serve.config import HTTPOptions, gRPCOptions

from dlscale.errors import ConfigError, DlscaleError
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository
from dlscale.scale.placement import placement_of
from dlscale.scale.settings import ScaleSettings

log = logging.getLogger("dlscale.scale")

INGRESS_APP = "dlscale"
MODEL_APP_PREFIX = "dlscale-model-"
#: The gRPC proxy imports this to serve the Open Inference Protocol's service.
GRPC_SERVICER = (
    "dlscale.wire.proto.grpc_gen.inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"
)
#: Per-request access logs in every replica cost more than a small model's compute.
QUIET = {"enable_access_log": False, "log_level": "WARNING"}


def model_app(name: str) -> str:
    """The Ray Serve application of a model."""
    return MODEL_APP_PREFIX + name


@dataclass(frozen=True)
class AppState:
    """A model application's state in Ray Serve: RUNNING, DEPLOYING, DEPLOY_FAILED, ..."""

    status: str
    message: str = ""


def start_serve(settings: ScaleSettings) -> None:
    """Start Ray Serve's controller and proxies (HTTP on every node; gRPC where asked)."""
    grpc = None
    if settings.grpc_port is not None:
        grpc = gRPCOptions(port=settings.grpc_port, grpc_servicer_functions=[GRPC_SERVICER])
    serve.start(
        proxy_location="EveryNode",
        http_options=HTTPOptions(host=settings.host, port=settings.http_port),
        grpc_options=grpc,
        logging_config=QUIET,
    )


def model_options(config: ModelConfig, settings: ScaleSettings) -> dict[str, Any]:
    """Ray Serve deployment options of a model: replicas, resources, in-flight requests."""
    placement = placement_of(config, settings.cpus_per_replica, settings.gpus_per_replica)
    placement = replace(placement, num_cpus=placement.num_cpus * settings.cpu_share)
    instances = sum(g.count for g in config.instances)
    full = instances * max(1, config.max_batch_size)  # one full batch per instance
    options: dict[str, Any] = {
        "name": config.name,
        "ray_actor_options": placement.actor_options(),
        # Enough requests in a replica for its batcher to form full batches while the
        # previous ones compute; Ray Serve's default (5) would cap every batch at 5.
        "max_ongoing_requests": max(16, 2 * full),
        "health_check_period_s": 2.0,
        "logging_config": QUIET,
    }
    if settings.autoscale is not None:
        low, high = settings.autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": full,
        }
    else:
        options["num_replicas"] = settings.replicas
    return options


def deploy_model(settings: ScaleSettings, name: str) -> None:
    """Deploy (or update in place) one model's application; returns once it runs.

    Blocking: from an event loop, run it in a thread.
    """
    from dlscale.scale.replica import ModelReplica

    repository = ModelRepository(settings.repository.resolve())
    source = repository.source(name)
    config = source.config
    repository.versions(name, source)  # fails here, fast, rather than in every replica
    deployment = serve.deployment(**model_options(config, settings))(ModelReplica)
    app = deployment.bind(str(repository.root), name, settings.metrics_interval_s)
    try:
        serve.run(app, name=model_app(name), route_prefix=None)
    except RuntimeError as exc:  # serve.run's report of a deployment that failed
        raise ConfigError(f"model {name!r} failed to deploy on Ray Serve: {exc}") from None
    log.info("model %s: deployed (%s)", name, _scale_of(settings))


def _scale_of(settings: ScaleSettings) -> str:
    if settings.autoscale is not None:
        low, high = settings.autoscale
        return f"autoscaling {low}..{high} replicas"
    return f"{settings.replicas} replica(s)"


def deploy_models(settings: ScaleSettings, names: list[str]) -> dict[str, str]:
    """Deploy each model in turn; a failure is logged and returned, the others still deploy."""
    failed = {}
    for name in names:
        try:
            deploy_model(settings, name)
        except DlscaleError as exc:
            log.error("model %s: %s", name, exc)
            failed[name] = str(exc)
    return failed


def delete_model(name: str) -> None:
    """Delete a model's application: its replicas finish their requests, then stop. Blocking."""
    serve.delete(model_app(name))


def model_states() -> dict[str, AppState]:
    """Every model application Ray Serve knows now, by model name. Blocking."""
    states = {}
    for app, overview in serve.status().applications.items():
        if app.startswith(MODEL_APP_PREFIX):
            name = app.removeprefix(MODEL_APP_PREFIX)
            states[name] = AppState(str(overview.status.value), overview.message)
    return states


def undeploy(names: list[str]) -> None:
    """Delete the ingress and the given models' applications."""
    serve.delete(INGRESS_APP)
    for name in names:
        serve.delete(model_app(name))
