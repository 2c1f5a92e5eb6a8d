"""Prefix routing on a Ray fleet: the router actor's HAProxy hashes the models that ask for it."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytest.importorskip("ray", reason="Ray Serve tests need the [ray] extra (ray[serve])")

import openai
from tests.integration.scale.conftest import Deployed

ROUTED = "colours-tenanted"


def test_the_ray_router_routes_the_models_that_ask_for_it_and_answers_them(
    deployed: Deployed,
) -> None:
    with urllib.request.urlopen(f"http://{deployed.http_url}/dlscale/fleet", timeout=60) as page:
        view = json.loads(page.read())
    assert view["routes"] == {ROUTED: 1024}  # its [routing]; the other models keep least work
    client = openai.OpenAI(
        base_url=f"http://{deployed.http_url}/v1", api_key="unused", max_retries=0, timeout=60
    )
    with client:
        for user in (None, "alice"):
            answer = client.chat.completions.create(
                model=ROUTED,
                messages=[{"role": "system", "content": "tenant-" + "x" * 2000}],
                max_tokens=2,
                **({"user": user} if user else {}),
            )
            assert answer.choices[0].message.content
