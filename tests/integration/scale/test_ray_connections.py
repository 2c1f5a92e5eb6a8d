"""The per-client cap of a Ray fleet is its router's (the router actor's HAProxy), and its
replicas take the router's connections uncapped: attacks through `dlscale serve --ray`."""

from __future__ import annotations

import pytest
from tests.integration.scale.conftest import RAY_MISSING, Deployed
from tests.toolkit.sources import LIVE, client, closed_at_once, flood, held

pytest.importorskip("ray", reason=RAY_MISSING)

from dlscale.frontends.limits import Limits

CAP = Limits().max_connections_per_peer
SLEEPER = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_the_router_holds_each_client_to_the_cap(deployed: Deployed) -> None:
    http, grpc = _port(deployed.http_url), _port(deployed.grpc_url)
    ready = f"http://{deployed.http_url}/v2/health/ready"
    with held(http, "127.0.0.5", CAP, LIVE):
        with client("127.0.0.5") as flooder:
            refused = flooder.get(ready)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert f"holds its maximum of {CAP} connections" in refused.json()["error"]
        with client("127.0.0.6") as other:
            assert other.get(ready).status_code == 200
    assert closed_at_once("127.0.0.5", grpc) is False  # under the cap: served
    with client("127.0.0.5") as flooder:
        assert flooder.get(ready).status_code == 200


def test_more_than_256_requests_at_once_from_several_sources_are_all_served(
    deployed: Deployed,
) -> None:
    url = f"http://{deployed.http_url}/v2/models/sleeper/infer"
    flooded = flood(url, SLEEPER, sources=5, per_source=64)
    assert flooded.answered > CAP and not flooded.refusals, flooded.refusals
