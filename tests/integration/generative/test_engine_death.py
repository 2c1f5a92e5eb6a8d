"""Issue 33: a generative engine whose thread dies makes its model not ready, with the cause.

A prompt longer than the KV cache used to kill the engine (transformers' "No requests can be
scheduled"); since issue 37 it is refused alone (400) and the model stays READY. The engine's
generation thread is then ended the way a crash ends it, by transformers' own hard stop
without dlscale asking: the model must be UNAVAILABLE with the cause in the index and
readiness, a request must fail at once (503, naming the cause) rather than wait for its timeout,
and the other models keep serving.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("transformers")

from tests.toolkit.server import LocalServer, serving

from dlscale.models.zoo import build_zoo

HEALTHY, STARVED = "llama-tiny", "llama-starved"
#: What the model's reason and the refusals say once its engine's thread ended unasked.
CAUSE = "the transformers engine died"
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
        too_long = generate(http, STARVED, LONG_PROMPT)
        assert too_long.status_code == 400 and "KV cache" in too_long.json()["error"]
        assert http.get(f"/v2/models/{STARVED}/ready").status_code == 200
        assert generate(http, STARVED, "hello").status_code == 200

        # The generation thread ends as a crash would end it: dlscale did not ask.
        backend: Any = server.server.manager.get(STARVED).instances[0].backend
        engine = backend._engine
        engine.manager.stop(block=True, timeout=30, hard_stop=True)

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
