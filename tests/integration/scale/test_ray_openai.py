"""The OpenAI API on a Ray fleet: a replica's own routes through the router, streams included."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray Serve tests need the [ray] extra (ray[serve])")

import openai
from tests.integration.scale.conftest import Deployed
from tests.toolkit.generative import greedy_words

from dlscale.errors import ConfigError


def _client(deployed: Deployed) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{deployed.http_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def test_openai_completions_through_the_router(deployed: Deployed) -> None:
    with _client(deployed) as client:
        assert "colours" in [m.id for m in client.models.list().data]
        answer = client.completions.create(
            model="colours", prompt="a b", max_tokens=3, temperature=0
        )
        assert answer.choices[0].text == " ".join(greedy_words("a b", 3))
        chunks = list(
            client.chat.completions.create(
                model="colours",
                messages=[{"role": "user", "content": "a"}],
                max_tokens=2,
                temperature=0,
                stream=True,
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == " ".join(greedy_words("a", 2))
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="p")


def test_the_api_key_is_refused_with_ray_whose_router_checks_none(tmp_path: Path) -> None:
    from dlscale.cli import parse
    from dlscale.scale.commands import settings_from

    with pytest.raises(ConfigError, match="--api-key is not available with --ray"):
        settings_from(parse(["serve", str(tmp_path), "--ray", "--api-key", "sk-key"]))
