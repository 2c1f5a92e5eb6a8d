"""Streamed answers with real clients: tritonclient's gRPC streams (ModelStreamInfer) and the REST
generate extension (httpx) against Python models that stream: Triton's decoupled model.py,
dlscale's `Model.stream`, and a Python model that follows the generative contract. A client
that leaves frees its sequence slot; priorities order the queue; a timeout drops a waiting
request; bad requests get a 4xx and lose nothing else."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.streaming_models import streaming_repository
from tests.toolkit.waiting import until

from dlscale.serving.seats import Seats

#: Long enough for anything here on a loaded machine; a hang fails instead of blocking forever.
PATIENCE_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    repo = streaming_repository(tmp_path_factory.mktemp("streams"))
    with serving(repo, metrics_port=0) as running:
        yield running


def _url(server: LocalServer, model: str, route: str) -> str:
    return f"http://{server.http_url}/v2/models/{model}/{route}"


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    """The server-sent events of a generate_stream answer, read to its end."""
    return [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]


def _seats(server: LocalServer, model: str) -> Seats:
    seats = server.dataplane.manager.get(model).runner.seats
    assert seats is not None
    return seats


# -- gRPC: ModelStreamInfer --------------------------------------------------------------------


def _grpc_stream(server: LocalServer) -> tuple[tg.InferenceServerClient, queue.Queue[Any]]:
    client = tg.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    return client, results


def _values(name: str, array: np.ndarray, datatype: str) -> tg.InferInput:
    tensor = tg.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def test_a_decoupled_triton_model_streams_over_grpc(server: LocalServer) -> None:
    client, results = _grpc_stream(server)
    values = _values("IN", np.array([5, 6, 7], np.int32), "INT32")
    client.async_stream_infer("repeat", [values], request_id="r1", enable_empty_final_response=True)
    got = []
    while True:
        result, error = results.get(timeout=PATIENCE_S)
        assert error is None
        got.append(result)
        if _final(result):
            break
    client.stop_stream()
    client.close()
    assert [r.as_numpy("OUT").tolist() for r in got[:-1]] == [[5], [6], [7]]
    assert [r.as_numpy("IDX").tolist() for r in got[:-1]] == [[0], [1], [2]]
    assert [_final(r) for r in got] == [False, False, False, True]
    assert got[-1].get_response().outputs == [] and got[-1].get_response().id == "r1"


def test_without_the_empty_final_flag_no_empty_response_is_sent(server: LocalServer) -> None:
    client, results = _grpc_stream(server)
    client.async_stream_infer("repeat", [_values("IN", np.array([1, 2], np.int32), "INT32")])
    # A model that answers once, on the same stream, comes after: its one response is final.
    client.async_stream_infer("plain", [_values("COUNT", np.array([9], np.int32), "INT32")])
    got = [results.get(timeout=PATIENCE_S) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in got)
    by_model = {}
    for result, _ in got:
        by_model.setdefault(result.get_response().model_name, []).append(result)
    assert [r.as_numpy("OUT").tolist() for r in by_model["repeat"]] == [[1], [2]]
    assert not any(_final(r) for r in by_model["repeat"])
    assert by_model["plain"][0].as_numpy("TICK").tolist() == [9] and _final(by_model["plain"][0])
    assert results.empty()


def test_user_code_that_raises_ends_its_stream_only(server: LocalServer) -> None:
    client, results = _grpc_stream(server)
    client.async_stream_infer("repeat", [_values("IN", np.array([3, -1, 4], np.int32), "INT32")])
    first, error = results.get(timeout=PATIENCE_S)
    assert error is None and first.as_numpy("OUT").tolist() == [3]
    _, error = results.get(timeout=PATIENCE_S)
    assert error is not None and "negative value -1" in str(error)
    # The stream and the model serve on.
    eight = _values("IN", np.array([8], np.int32), "INT32")
    client.async_stream_infer("repeat", [eight], enable_empty_final_response=True)
    answers = [results.get(timeout=PATIENCE_S) for _ in range(2)]
    client.stop_stream()
    client.close()
    assert answers[0][0].as_numpy("OUT").tolist() == [8] and _final(answers[1][0])


def test_malformed_stream_requests_get_their_error_in_stream(server: LocalServer) -> None:
    client, results = _grpc_stream(server)
    wrong = _values("NOT_IN", np.array([1], np.int32), "INT32")
    client.async_stream_infer("repeat", [wrong], request_id="bad-input")
    client.async_stream_infer("ghost", [wrong], request_id="no-model")
    floats = _values("IN", np.array([1.5], np.float32), "FP32")
    client.async_stream_infer("repeat", [floats], request_id="bad-type")
    errors = sorted(str(results.get(timeout=PATIENCE_S)[1]) for _ in range(3))
    client.async_stream_infer(
        "repeat", [_values("IN", np.array([2], np.int32), "INT32")], request_id="good"
    )
    result, error = results.get(timeout=PATIENCE_S)
    client.stop_stream()
    client.close()
    assert "datatype INT32" in errors[0] and "unknown model 'ghost'" in errors[2]
    assert "the request lacks ['IN']" in errors[1]
    assert error is None and result.as_numpy("OUT").tolist() == [2]


def test_a_generate_body_above_the_limit_is_refused_before_it_is_read(
    server: LocalServer,
) -> None:
    body = b'{"text_input": "' + b"x" * (5 * 2**20) + b'"}'
    response = httpx.post(_url(server, "echo", "generate_stream"), content=body)
    assert response.status_code == 413 and "exceeds the limit" in response.json()["error"]


def test_a_grpc_client_that_cancels_frees_its_sequence(server: LocalServer) -> None:
    client, results = _grpc_stream(server)
    client.async_stream_infer("ticker", [_values("COUNT", np.array([-1], np.int32), "INT32")])
    result, error = results.get(timeout=PATIENCE_S)
    assert error is None and result.as_numpy("TICK").tolist() == [0]
    assert _seats(server, "ticker").running == 1
    client.stop_stream(cancel_requests=True)
    client.close()
    until(lambda: _seats(server, "ticker").running == 0)


def test_one_grpc_stream_holds_at_most_its_bound_of_requests(tmp_path: Path) -> None:
    """A client that pushes request after request into one stream is read no further than
    --max-stream-requests in flight: the rest wait in its own connection, not the server."""
    with serving(streaming_repository(tmp_path), max_stream_requests=3) as bounded:
        client, results = _grpc_stream(bounded)
        forever = [_values("COUNT", np.array([-1], np.int32), "INT32")]
        for _ in range(12):  # the first holds ticker's one seat; the others would all wait
            client.async_stream_infer("ticker", forever)
        until(lambda: _seats(bounded, "ticker").waiting == 2)
        time.sleep(0.3)  # time for requests past the bound to arrive, were they read
        assert _seats(bounded, "ticker").waiting == 2
        client.stop_stream(cancel_requests=True)
        client.close()
        until(lambda: _seats(bounded, "ticker").running == 0)
        assert results.get(timeout=PATIENCE_S)[1] is None


# -- REST: the generate extension ----------------------------------------------------------------


def test_generate_stream_sends_each_token_as_an_event(server: LocalServer) -> None:
    body = {"text_input": "one two three four", "parameters": {"max_tokens": 3}, "id": "g1"}
    with httpx.stream("POST", _url(server, "echo", "generate_stream"), json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        events = _events(response)
    assert "".join(e["text_output"] for e in events) == "one two three"
    assert [e["num_output_tokens"] for e in events] == [1, 2, 3]
    assert events[-1]["finish_reason"] == "length" and events[-1]["id"] == "g1"
    assert all(e["model_name"] == "echo" and e["model_version"] == "1" for e in events)


def test_a_caller_that_closes_once_it_has_the_final_response_is_a_success(
    server: LocalServer,
) -> None:
    """The OpenAI routes stop reading at the final response: that is an answer, not a cancel."""
    from dlscale.types import InferenceRequest

    before = server.dataplane.statistics("echo")[0]
    request = InferenceRequest(
        "echo", {"text_input": np.array([b"a b"], dtype=object)}, parameters={"max_tokens": 2}
    )

    async def until_final() -> bool:
        responses = server.dataplane.stream(request)
        async for response in responses:
            if response.final:
                await responses.aclose()  # type: ignore[attr-defined]
                return True
        return False

    assert server.run(until_final())
    after = server.dataplane.statistics("echo")[0]
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.fail.count == before.inference_stats.fail.count


def test_generate_joins_a_generative_stream(server: LocalServer) -> None:
    body = {"text_input": "to be or not", "max_tokens": 8}
    answer = httpx.post(_url(server, "echo", "generate"), json=body, timeout=PATIENCE_S).json()
    assert answer["text_output"] == "to be or not"
    assert answer["finish_reason"] == "stop"
    assert (answer["num_input_tokens"], answer["num_output_tokens"]) == (4, 4)


def test_generate_answers_a_model_that_answers_once(server: LocalServer) -> None:
    answer = httpx.post(_url(server, "plain", "generate"), json={"COUNT": 4}).json()
    assert answer["TICK"] == 4


def test_metadata_lists_generate_and_config_says_decoupled(server: LocalServer) -> None:
    base = f"http://{server.http_url}/v2"
    assert "generate" in httpx.get(base).json()["extensions"]
    config = httpx.get(f"{base}/models/repeat/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}


@pytest.mark.parametrize(
    ("model", "route", "body", "status", "words"),
    [
        ("echo", "generate_stream", b"{not json", 400, "JSON"),
        ("echo", "generate_stream", b"[1, 2]", 400, "JSON object"),
        ("ghost", "generate_stream", {"text_input": "x"}, 404, "unknown model"),
        ("echo", "generate_stream", {"text_input": "x", "temperature": 5}, 400, "temperature"),
        ("echo", "generate", {"text_input": "x", "max_tokens": -2}, 400, "max_tokens"),
        ("echo", "generate_stream", {"text_input": 7}, 400, "BYTES"),
        ("echo", "generate_stream", {"text_input": ["a", ["b"]]}, 400, "flat list"),
        ("echo", "generate_stream", {"text_input": "x", "priority": -1}, 400, "priority"),
        ("plain", "generate_stream", {"COUNT": 1}, 400, "does not stream"),
        ("repeat", "generate", {"IN": [1]}, 400, "generate_stream"),
        ("repeat", "infer", {"inputs": []}, 400, "ModelStreamInfer"),
        # Found by tests/integration/generative/test_fuzz_generate.py: a 500 before.
        (
            "echo",
            "generate",
            b'{"text_input": "x", "stop": ["a", 10000000000000000000000]}',
            400,
            "64 bits",
        ),
        ("echo", "generate", b'{"text_input": "x", "seed": 100000000000000000000000}', 400, "64"),
    ],
)
def test_bad_requests_get_a_4xx_that_says_why(
    server: LocalServer, model: str, route: str, body: Any, status: int, words: str
) -> None:
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = httpx.post(_url(server, model, route), timeout=PATIENCE_S, **sent)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    # Nothing else was lost: the model serves the next request.
    ok = httpx.post(_url(server, "echo", "generate"), json={"text_input": "still here"})
    assert ok.json()["text_output"] == "still here"


def test_a_repeat_infer_body_is_decoded_before_the_refusal(server: LocalServer) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    response = httpx.post(_url(server, "repeat", "infer"), json=body)
    assert response.status_code == 400 and "decoupled" in response.json()["error"]


# -- the queue in front of a model that streams --------------------------------------------------


def _collect(server: LocalServer, body: dict[str, Any], into: list[Any], tag: str = "") -> None:
    with httpx.stream(
        "POST", _url(server, "ticker", "generate_stream"), json=body, timeout=PATIENCE_S
    ) as response:
        if response.status_code != 200:
            response.read()
            into.append((tag, response.status_code, response.json()["error"]))
            return
        into.append((tag, [e["TICK"] for e in _events(response)]))


@contextmanager
def _holding(server: LocalServer, count: int = -1) -> Iterator[None]:
    """The ticker's one sequence slot held by a stream that never ends (or, with `count`, ticks
    as fast as it can), until the block ends."""
    body = {"COUNT": count}
    with httpx.stream(
        "POST", _url(server, "ticker", "generate_stream"), json=body, timeout=PATIENCE_S
    ) as held:
        lines = held.iter_lines()  # kept: dropping the iterator would close the connection
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["TICK"] == 0
        assert _seats(server, "ticker").running == 1
        yield  # leaving closes the connection mid-stream: the client is gone


def test_a_client_that_disconnects_frees_its_slot_for_the_next(server: LocalServer) -> None:
    got: list[Any] = []
    with _holding(server):
        waiting = threading.Thread(target=_collect, args=(server, {"COUNT": 2}, got))
        waiting.start()
        until(lambda: _seats(server, "ticker").waiting == 1)
    waiting.join(PATIENCE_S)
    assert got == [("", [0, 1])]
    until(lambda: _seats(server, "ticker").running == 0)


def _seated_then_held(
    server: LocalServer, priority: int, tag: str, seated: queue.Queue[str], go: threading.Event
) -> None:
    """A ticker stream that never ends: its tag goes to `seated` at its first tick (it holds
    the one slot from then on), and it leaves once `go` is set."""
    body = {"COUNT": -1, "parameters": {"priority": priority}}
    with httpx.stream(
        "POST", _url(server, "ticker", "generate_stream"), json=body, timeout=PATIENCE_S
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        seated.put(tag)
        go.wait(PATIENCE_S)


def test_priorities_order_the_waiting_requests(server: LocalServer) -> None:
    # Each waiting request, once seated, holds the one slot until released, so the order the
    # server seats them in is the order their first ticks arrive, whatever the client threads'
    # scheduling (the order in which two short streams' clients finish reading is not).
    seated: queue.Queue[str] = queue.Queue()
    leave = {"low": threading.Event(), "high": threading.Event()}
    threads = []
    with _holding(server):
        for tag, priority in (("low", 2), ("high", 1)):
            args = (server, priority, tag, seated, leave[tag])
            threads.append(threading.Thread(target=_seated_then_held, args=args))
            threads[-1].start()
            waiting = len(threads)
            until(lambda n=waiting: _seats(server, "ticker").waiting == n)  # type: ignore[misc]
    try:
        assert seated.get(timeout=PATIENCE_S) == "high"  # arrived last, seated first
        assert _seats(server, "ticker").waiting == 1 and seated.empty()  # low still waits
        leave["high"].set()
        assert seated.get(timeout=PATIENCE_S) == "low"
    finally:
        for event in leave.values():
            event.set()
        for thread in threads:
            thread.join(PATIENCE_S)
    until(lambda: _seats(server, "ticker").running == 0)


def test_a_request_whose_timeout_passes_while_it_waits_is_dropped(server: LocalServer) -> None:
    got: list[Any] = []
    with _holding(server):
        _collect(server, {"COUNT": 1, "timeout": 50_000}, got)  # 50 ms, in microseconds
        assert _seats(server, "ticker").waiting == 0
    assert got[0][1] == 503 and "timed out" in got[0][2]
    _collect(server, {"COUNT": 1}, got)
    assert got[1] == ("", [0])


# -- metrics ---------------------------------------------------------------------------------


def test_token_metrics_count_every_frontend(server: LocalServer) -> None:
    port = server.server.ports["metrics"]
    before = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    httpx.post(_url(server, "echo", "generate"), json={"text_input": "a b c"})
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    labels = '{model="echo",version="1"}'

    def value(name: str, source: str) -> float:
        line = next((x for x in source.splitlines() if x.startswith(name + labels)), "")
        return float(line.split()[-1]) if line else 0.0

    assert value("dlscale_generation_tokens_total", text) == (
        value("dlscale_generation_tokens_total", before) + 3
    )
    assert value("dlscale_prompt_tokens_total", text) >= 3
    assert value("dlscale_time_to_first_token_seconds_count", text) >= 1
    assert value("dlscale_time_per_output_token_seconds_count", text) >= 1
    assert "dlscale_sequences_running" in text and "dlscale_sequences_waiting" in text


def test_a_decoupled_model_asked_for_a_worker_process_is_refused_at_load(
    server: LocalServer,
) -> None:
    rows = httpx.post(f"http://{server.http_url}/v2/repository/index", json={}).json()
    isolated = next(r for r in rows if r["name"] == "isolated")
    assert isolated["state"] == "UNAVAILABLE"
    assert "isolation 'process' is not offered" in isolated["reason"]


# -- REST worker processes: streams forwarded over the worker channel ------------------------------


def test_streams_cross_the_rest_workers_and_a_disconnect_frees_the_slot(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    repo = streaming_repository(tmp_path_factory.mktemp("streams_workers"))
    with serving(repo, http_workers=1) as workers:
        body = {"text_input": "over the channel", "max_tokens": 2}
        with httpx.stream("POST", _url(workers, "echo", "generate_stream"), json=body) as response:
            events = _events(response)
        assert [e["text_output"] for e in events] == ["over", " the"]
        joined = httpx.post(_url(workers, "echo", "generate"), json=body, timeout=PATIENCE_S)
        assert joined.json()["text_output"] == "over the"
        refused = httpx.post(_url(workers, "plain", "generate_stream"), json={"COUNT": 1})
        assert refused.status_code == 400 and "does not stream" in refused.json()["error"]
        got: list[Any] = []
        with _holding(workers):
            waiting = threading.Thread(target=_collect, args=(workers, {"COUNT": 2}, got))
            waiting.start()
            until(lambda: _seats(workers, "ticker").waiting == 1)
        waiting.join(PATIENCE_S)
        assert got == [("", [0, 1])]
        until(lambda: _seats(workers, "ticker").running == 0)
        # Responses the owner sent after the worker's Cancel are dropped; the channel serves on.
        for _ in range(3):
            with _holding(workers, count=10**9):
                pass
        again = httpx.post(_url(workers, "echo", "generate"), json=body, timeout=PATIENCE_S)
        assert again.json()["text_output"] == "over the"
