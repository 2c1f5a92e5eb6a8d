"""Issue 33: a generative engine whose thread dies makes its model not ready, with the cause.

The engine dies for real: llama-tiny with a KV cache of one page, and a prompt longer than that
page, makes transformers' generation thread raise ("No requests can be scheduled") and end. The
model must then be UNAVAILABLE with the cause in the index and readiness, a request must fail at
once (503, naming the cause) rather than wait for its timeout, and the other models keep serving.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("transformers")

from tests.toolkit.server import LocalServer, serving

from dlscale.models.zoo import build_zoo

HEALTHY, STARVED = "llama-tiny", "llama-starved"
#: The engine's own words for a sequence that no KV cache page can take.
CAUSE = "No requests can be scheduled"
#: More tokens than one KV-cache page (64) holds.
LONG_PROMPT = " ".join(["a story about the cache"] * 40)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("engine_death")
    build_zoo(root, [HEALTHY])
    shutil.copytree(root / HEALTHY, root / STARVED)
    config = root / STARVED / "config.toml"
    text = config.read_text().replace(f'name = "{HEALTHY}"', f'name = "{STARVED}"')
    # A KV cache of one page: no prompt longer than a page is ever scheduled.
    config.write_text(text.replace("kv_cache_gib = 0.0625", "kv_cache_gib = 0.0000001"))
    with serving(root) as running:
        yield running


def generate(http: httpx.Client, model: str, prompt: str) -> httpx.Response:
    body = {"text_input": prompt, "parameters": {"max_tokens": 4, "temperature": 0.0}}
    return http.post(f"/v2/models/{model}/generate", json=body)


def test_a_dead_engine_makes_its_model_unavailable_with_the_cause(
    server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A safety net only: the engine's death must be reported long before this.
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=120) as http:
        assert http.get(f"/v2/models/{STARVED}/ready").status_code == 200
        killing = generate(http, STARVED, LONG_PROMPT)
        assert killing.status_code == 503, killing.text
        assert CAUSE in killing.json()["error"]

        index = {m["name"]: m for m in http.post("/v2/repository/index").json()}
        for _ in range(600):  # the report reaches the event loop from the engine's threads
            if index[STARVED]["state"] != "READY":
                break
            time.sleep(0.05)  # a safety net of 30 s, not a timing figure
            index = {m["name"]: m for m in http.post("/v2/repository/index").json()}
        assert index[STARVED]["state"] == "UNAVAILABLE"
        assert CAUSE in index[STARVED]["reason"]
        assert http.get(f"/v2/models/{STARVED}/ready").status_code != 200

        refused = generate(http, STARVED, "hello")  # at once: no engine, no wait
        assert refused.status_code == 503
        assert CAUSE in refused.json()["error"]

        died = [r for r in caplog.records if r.levelname == "ERROR" and STARVED in r.getMessage()]
        assert any(CAUSE in r.getMessage() for r in died)  # the log names model and cause

        healthy = generate(http, HEALTHY, "hello")
        assert healthy.status_code == 200, healthy.text
        assert http.get(f"/v2/models/{HEALTHY}/ready").status_code == 200
