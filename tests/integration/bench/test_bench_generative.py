"""The generative bench against dlscale serving the zoo's llama-tiny (transformers backend):
streams over OpenAI completions, chat and OIP generate_stream, a trace replay, sweeps and
MLPerf LoadGen with token latencies, through the `dlscale bench` command line."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.toolkit.server import LocalServer, serving
from tests.toolkit.slow import slow_only

from dlscale.bench.generative.client import StreamClient
from dlscale.bench.generative.endpoints import Ask, Endpoint
from dlscale.bench.generative.load import Job, closed_loop, open_loop
from dlscale.bench.generative.mlperf import TokenBounds, TokenSut, settings_for, token_summary
from dlscale.bench.generative.prompts import Lengths, PromptMaker, synthetic_asks
from dlscale.bench.generative.records import Chunk, StreamRecord
from dlscale.bench.generative.tokens import TokenCounter
from dlscale.bench.generative.trace import read_trace, trace_asks
from dlscale.bench.loadgen import LoopThread, run_loadgen
from dlscale.bench.scenarios import Scenario
from dlscale.cli import main
from dlscale.models.zoo import build_zoo

MODEL = "llama-tiny"
OSL = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's root; the model's Hugging Face folder is MODEL/1."""
    root = tmp_path_factory.mktemp("genbench_repo")
    build_zoo(root, [MODEL])
    return root


@pytest.fixture(scope="module")
def llm(folder: Path) -> Iterator[LocalServer]:
    with serving(folder) as running:
        yield running


def URL(server: LocalServer) -> str:
    return f"http://{server.http_url}"


def jobs(folder: Path, count: int, isl: int = 12) -> list[Job]:
    maker = PromptMaker(TokenCounter(folder / MODEL / "1"), seed=1)
    return [Job(a, n) for a, n in synthetic_asks(maker, count, Lengths(isl), Lengths(OSL))]


@pytest.mark.parametrize("kind", list(Endpoint))
def test_each_endpoint_streams_max_tokens_with_ttft_before_the_end(
    llm: LocalServer, folder: Path, kind: Endpoint
) -> None:
    async def run() -> list:  # type: ignore[type-arg]
        async with StreamClient(URL(llm), kind, MODEL) as client:
            return await closed_loop(client, jobs(folder, 2), concurrency=2)

    records = asyncio.run(run())
    assert len(records) == 2
    for r in records:
        assert r.ok, r.error
        # ignore_eos: the server generated exactly what was asked, and said so.
        assert r.tokens == OSL and r.token_source == "server"
        assert r.ttft_ns is not None and r.latency_ns is not None
        assert 0 < r.ttft_ns <= r.latency_ns
        assert r.tpot_ns is not None and r.tpot_ns >= 0
        assert r.finish_reason == "length"


def test_synthetic_prompts_hold_their_token_length(folder: Path) -> None:
    counter = TokenCounter(folder / MODEL / "1")
    maker = PromptMaker(counter, seed=5)
    for tokens in (1, 7, 33, 100):
        text, counted = maker.prompt(tokens)
        assert counted == tokens == counter.count(text)


def test_trace_replay_sends_in_trace_order_no_earlier_than_its_offsets(
    llm: LocalServer, folder: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    stamps = [300, 0, 200, 100]  # milliseconds, out of order in the file
    trace.write_text(
        "\n".join(
            json.dumps({"timestamp": 5000 + t, "input_length": 4 + i, "output_length": 3})
            for i, t in enumerate(stamps)
        )
    )
    maker = PromptMaker(TokenCounter(folder / MODEL / "1"), seed=0)
    timed = [Job(a, n, t) for a, n, t in trace_asks(read_trace(trace), maker)]

    async def run() -> tuple[int, list]:  # type: ignore[type-arg]
        async with StreamClient(URL(llm), Endpoint.GENERATE, MODEL) as client:
            # The offsets count from the loop's start, taken just after this: not from the
            # first record's send, which a busy machine may delay past its own offset.
            before = time.perf_counter_ns()
            return before, await open_loop(client, timed)

    before, records = asyncio.run(run())
    assert [r.scheduled_s for r in records] == [0.0, 0.1, 0.2, 0.3]
    assert [r.input_tokens for r in records] == [5, 7, 6, 4]  # the lines' ISLs, in time order
    for r in records:
        assert r.ok, r.error
        assert (r.sent_ns - before) / 1e9 >= r.scheduled_s - 0.001  # the loop timer's grain


def test_cli_sweeps_and_loadgen_offline_with_token_latencies(
    llm: LocalServer, folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    code = main(
        ["bench", URL(llm), "--generative", "openai", "--model", MODEL,
         "--tokenizer", str(folder / MODEL / "1"), "--isl", "8", "--osl", "4",
         "--requests", "3", "--concurrency", "1,2", "--scenario", "offline",
         "--duration", "0.5s", "--ttft-ms", "60000", "--tpot-ms", "30000", "--out", str(out),
         "--warmup-requests", "1"]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    points = report["points"]
    assert [(p["load"], p["concurrency"]) for p in points] == [
        ("concurrency", 1),
        ("concurrency", 2),
    ]
    for p in points:
        assert (p["succeeded"], p["failed"], p["output_tokens"]) == (3, 0, 12)
        assert p["ttft"]["p50"] <= p["latency"]["p50"]
        # Loose bounds: every request met them, so goodput is the request rate.
        assert p["slo_met"] == 3 and p["goodput_per_s"] == pytest.approx(p["requests_per_s"])
    (offline,) = report["loadgen"]
    assert offline["scenario"] == "Offline"
    assert offline["verdict"] == "VALID", offline["reasons"]
    assert offline["loadgen"]["token_fields"]["Tokens per second"] > 0
    assert (out / "loadgen" / "offline" / "mlperf_log_summary.txt").is_file()
    assert (out / "tokens.png").is_file() and (out / "report.md").is_file()


def test_cli_names_an_endpoint_that_does_not_stream(llm: LocalServer, tmp_path: Path) -> None:
    code = main(
        ["bench", URL(llm), "--generative", "generate", "--model", "no-such-model",
         "--isl", "4", "--osl", "2", "--requests", "2", "--out", str(tmp_path / "r")]
    )  # fmt: skip
    assert code == 1


@slow_only("a LoadGen Server run needs ~500 queries for its early-stopping estimate")
def test_cli_loadgen_server_valid_for_loose_bounds(
    llm: LocalServer, folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "server"
    code = main(
        ["bench", URL(llm), "--generative", "generate", "--model", MODEL,
         "--tokenizer", str(folder / MODEL / "1"), "--isl", "8", "--osl", "3",
         "--requests", "16", "--rate", "10,20", "--scenario", "server", "--target-qps", "20",
         "--duration", "2s", "--ttft-ms", "60000", "--tpot-ms", "30000", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert [p["rate"] for p in report["points"]] == [10.0, 20.0]
    assert all(p["succeeded"] == 16 for p in report["points"])
    (server,) = report["loadgen"]
    assert server["verdict"] == "VALID", server["reasons"]
    assert "99.00 percentile first token latency (ns)" in server["loadgen"]["token_fields"]


def test_loadgen_completes_failed_streams_and_says_why(
    llm: LocalServer, folder: Path, tmp_path: Path
) -> None:
    good = jobs(folder, 1)[0]
    # Past llama-tiny's 512-token context: the server refuses it with a 400 before streaming.
    refused = Job(Ask("word " * 2000, OSL), 2000)
    loop = LoopThread()
    client = StreamClient(URL(llm), Endpoint.COMPLETIONS, MODEL)
    try:
        loop.run(client.__aenter__())
        sut = TokenSut(client, [good, refused], loop, concurrency=2)
        bounds = TokenBounds.choose(None, 60000, 30000)
        settings = settings_for(Scenario.OFFLINE, bounds, duration_s=0.1, min_queries=4,
                                target_qps=None, expected_qps=4.0, seed=0)  # fmt: skip
        run_loadgen(sut, 2, settings, tmp_path / "lg")  # returns: every sample was completed
    finally:
        loop.run(client.__aexit__(None, None, None))
        loop.close()
    failed = [r for r in sut.records if not r.ok]
    assert failed and all("HTTP 400" in (r.error or "") for r in failed)
    assert any(r.ok and r.tokens == OSL for r in sut.records)
    assert token_summary(tmp_path / "lg")["result"] in ("VALID", "INVALID")


def test_without_a_server_count_the_tokenizer_counts_the_output(folder: Path) -> None:
    counter = TokenCounter(folder / MODEL / "1")
    text = "GPU memory and the cache"
    record = StreamRecord(sent_ns=0, chunks=[Chunk(1, text[:9]), Chunk(2, text[9:])], done_ns=3)
    StreamClient("http://127.0.0.1:1", Endpoint.GENERATE, MODEL, counter=counter)._count(record)
    assert record.token_source == "tokenizer"
    assert record.tokens == counter.count(text) > 2
    StreamClient("http://127.0.0.1:1", Endpoint.GENERATE, MODEL)._count(record)
    assert record.token_source == "chunks"
