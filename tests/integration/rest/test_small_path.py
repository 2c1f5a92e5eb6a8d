"""What the small-request path decides once (issue 39) still follows the settings that change.

The path reads whether anything is traced from one attribute the trace settings keep, goes
straight to a cached route's handler, and answers from the version's request plan. Each test
changes a setting, or repeats a request, while the server serves, and checks that the next
request meets the rule: traced once tracing is on and no more once it is off; refused without
the key however often the path was seen; refused for a wrong datatype or shape on a plan built
by an earlier good request.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.models import write_null_model
from tests.toolkit.server import serving
from tritonclient.utils import InferenceServerException

ECHO = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
KEY = "sk-small-path"


def _infer(url: str, request_id: str, **headers: str) -> httpx.Response:
    body = {"id": request_id, "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                          "data": [1, 2]}]}  # fmt: skip
    return httpx.post(f"http://{url}/v2/models/echo/infer", json=body, headers=headers, timeout=60)


def _traced_ids(path: Path) -> set[str]:
    return {e["request_id"] for e in json.loads(path.read_text()) if "request_id" in e}


def test_tracing_turned_on_and_off_while_serving_follows_at_the_next_request(
    tmp_path: Path,
) -> None:
    root, trace = tmp_path / "repo", tmp_path / "trace.json"
    write_null_model(root, "echo", ECHO)
    with serving(root, trace_file=trace) as server:
        url = server.http_url
        assert _infer(url, "before").status_code == 200
        on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        assert httpx.post(f"http://{url}/v2/trace/setting", json=on).status_code == 200
        assert _infer(url, "while-on").status_code == 200
        off = {"trace_level": ["OFF"]}
        assert httpx.post(f"http://{url}/v2/trace/setting", json=off).status_code == 200
        assert _infer(url, "after").status_code == 200
    assert _traced_ids(trace) == {"while-on"}


def test_a_path_seen_before_still_needs_the_key(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_null_model(root, "echo", ECHO)
    with serving(root, api_key=KEY) as server:
        url = server.http_url
        assert _infer(url, "a", authorization=f"Bearer {KEY}").status_code == 200
        for n in range(3):  # the route is cached now: each request still shows its key
            refused = _infer(url, f"no-key-{n}")
            assert refused.status_code == 401, refused.text
            assert _infer(url, f"wrong-{n}", authorization="Bearer sk-guessed").status_code == 401
        assert _infer(url, "b", authorization=f"Bearer {KEY}").status_code == 200


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (np.ones((1, 2), np.float64), "has datatype FP32; the request gave FP64"),
        (np.ones((1, 3), np.float32), "has shape [-1, 2]; the request gave [1, 3]"),
        (np.ones((5, 2), np.float32), "batch size 5 exceeds max_batch_size 4"),
        (np.ones((0, 2), np.float32), "batch size 0"),
    ],
    ids=["datatype", "shape", "batch", "empty"],
)
def test_the_plan_refuses_what_the_model_does_not_take(
    tmp_path: Path, array: np.ndarray, says: str
) -> None:
    root = tmp_path / "repo"
    write_null_model(root, "echo", ECHO)
    with serving(root) as server:
        client = th.InferenceServerClient(server.http_url)
        try:
            good = th.InferInput("x", [1, 2], "FP32")
            good.set_data_from_numpy(np.ones((1, 2), np.float32))
            assert client.infer("echo", [good]).as_numpy("y").shape == (1, 2)  # plan built
            datatype = "FP64" if array.dtype == np.float64 else "FP32"
            bad = th.InferInput("x", list(array.shape), datatype)
            bad.set_data_from_numpy(array)
            with pytest.raises(InferenceServerException, match=re.escape(says)) as caught:
                client.infer("echo", [bad])
            assert caught.value.status() == "400"
            assert client.infer("echo", [good]).as_numpy("y").shape == (1, 2)
        finally:
            client.close()
