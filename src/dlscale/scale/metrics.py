"""The fleet's one metrics page: every replica's own /metrics, each sample labelled by replica.

The router actor scrapes each replica's child (its metrics port) when its own page is read, and
adds `replica` (the Ray Serve replica) and `node` (the Ray node) to every sample; the families
keep dlscale's names (Triton's `nv_inference_*` and dlscale's own), so one scrape of the router's
metrics port sees the fleet, and `sum by (model)` adds the replicas up. A replica that does not
answer within SCRAPE_TIMEOUT_S is left out of that page (`dlscale_fleet_scrape_ok` says which).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import httpx

from dlscale.scale.registry import Replica

SCRAPE_TIMEOUT_S = 5.0


async def _scrape(client: httpx.AsyncClient, replica: Replica) -> str | None:
    e = replica.endpoint
    if e.metrics_port is None:
        return None
    try:
        page = await client.get(f"http://{e.host}:{e.metrics_port}/metrics")
    except httpx.HTTPError:
        return None
    return page.text if page.is_success else None


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(.*)$")


def _labelled(line: str, extra: str) -> str:
    """A sample line with `extra` (`replica="..",node=".."`) added to its labels."""
    match = _SAMPLE.match(line)
    if match is None:
        return line
    name, labels, value = match.groups()
    return f"{name}{{{labels + ',' if labels else ''}{extra}}} {value}"


def merge(pages: Sequence[tuple[Replica, str | None]]) -> str:
    """The families of every page, each sample with its replica's `replica` and `node` labels.

    Text in, text out: the names stay exactly the replicas' (a parse and render through
    prometheus_client would rename a counter to `..._total`). A family's samples stay together.
    """
    families: dict[str, list[str]] = {}
    up = ["# HELP dlscale_fleet_scrape_ok 1 when the replica's metrics were read",
          "# TYPE dlscale_fleet_scrape_ok gauge"]  # fmt: skip
    for replica, text in pages:
        extra = f'replica="{replica.key}",node="{replica.node}"'
        up.append(f"dlscale_fleet_scrape_ok{{{extra}}} {float(text is not None)}")
        family: list[str] = []
        for line in (text or "").splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                name = line.split()[2]
                fresh = name not in families
                family = families.setdefault(name, [])
                if fresh or not any(x.startswith(line[:7]) for x in family):
                    family.append(line)
            elif line and not line.startswith("#"):
                family.append(_labelled(line, extra))
    lines = [line for family in families.values() for line in family]
    return "\n".join([*lines, *up]) + "\n"


async def fleet_metrics(replicas: Sequence[Replica]) -> bytes:
    """The fleet's page in Prometheus' text format."""
    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
        texts = await asyncio.gather(*(_scrape(client, r) for r in replicas))
    return merge(list(zip(replicas, texts, strict=True))).encode()
