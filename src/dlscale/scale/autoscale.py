"""`--autoscale MIN:MAX` on Ray Serve's autoscaler, by the requests in flight in the replicas.

Requests do not pass through Ray Serve, so its own count of ongoing requests is zero; instead
each replica reports what its server holds now (`nv_inference_pending_request_count`, queued or
computing, summed over its models: `record_autoscaling_stats`), and `fleet_policy`, a custom
policy run by Ray Serve's controller, asks for enough replicas that each holds
`target_ongoing_requests` of them. Ray's wrapper around a custom policy then applies MIN and
MAX and its up- and down-scaling delays.
"""

from __future__ import annotations

import math
from typing import Any

#: The custom metric each replica reports.
IN_FLIGHT = "dlscale_in_flight"
_PENDING = "nv_inference_pending_request_count"


def in_flight(metrics_page: str) -> float:
    """The requests a server holds now, from its Prometheus page (every model's, added)."""
    total = 0.0
    for line in metrics_page.splitlines():
        if line.startswith((f"{_PENDING}{{", f"{_PENDING} ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def fleet_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Replicas wanted: the fleet's requests in flight over each replica's target (at least
    one); Ray applies MIN, MAX and the delays around it."""
    per_replica = (ctx.aggregated_metrics or {}).get(IN_FLIGHT, {})
    total = float(sum(per_replica.values()))
    target = float(ctx.config.target_ongoing_requests or 1.0)
    return max(1, math.ceil(total / target)), {}


def autoscaling_config(low: int, high: int, target: float) -> dict[str, Any]:
    """Ray Serve's `autoscaling_config` of the fleet's deployment."""
    return {
        "min_replicas": low,
        "max_replicas": high,
        "target_ongoing_requests": target,
        "metrics_interval_s": 1.0,
        "look_back_period_s": 5.0,
        "upscale_delay_s": 3.0,
        "downscale_delay_s": 60.0,
        "policy": {"policy_function": fleet_policy},
    }
