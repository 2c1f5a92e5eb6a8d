"""A new replica's replay of the fleet's loads and unloads, on a real `dlscale serve` child.

The child's start loads the repository's models; a plain load recorded before it began reads
the same files, so the replay leaves it out (a successor used to load each such model twice).
Loads with parameters, loads recorded later, unloads and models the start did not load are
sent as they came.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.python_models import LOADED_ONLY_PBTXT, write_triton_python_model
from tests.toolkit.server import settings_for

from dlscale.scale import control
from dlscale.scale.child import Endpoint, ServerChild
from dlscale.scale.haproxy_config import GRPC, REST
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

#: A Triton Python model that writes a line beside itself each time it loads.
COUNTED = """
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        with open(Path(args["model_repository"]) / "loads", "a") as f:
            f.write("load\\n")

    def execute(self, requests):
        raise NotImplementedError("only loaded")
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Endpoint, Path]]:
    repo = tmp_path_factory.mktemp("replay-repo")
    folder = write_triton_python_model(repo, "counted", COUNTED, LOADED_ONLY_PBTXT)
    # As a fleet's replicas run when loads go through the API: every model loaded at start.
    server = ServerChild(settings_for(repo))
    endpoint = server.start(timeout_s=120)
    try:
        yield endpoint, folder / "loads"
    finally:
        server.stop()


def _loads(path: Path) -> int:
    return len(path.read_text().splitlines())


def _rest_load(seq: int, body: bytes = b"") -> control.Entry:
    return control.Entry(seq, "counted", REST, "/v2/repository/models/counted/load", body)


def _grpc_load(seq: int, request: pb.RepositoryModelLoadRequest) -> control.Entry:
    path = "/inference.GRPCInferenceService/RepositoryModelLoad"
    return control.Entry(seq, "counted", GRPC, path, request.SerializeToString())


def test_a_plain_load_read_by_the_start_is_not_replayed(child: tuple[Endpoint, Path]) -> None:
    endpoint, loads = child
    before = _loads(loads)
    assert before >= 1  # the child's start loaded it
    plain = [_rest_load(3), _rest_load(4, b'{"parameters": {}}')]
    for entry in plain:
        assert asyncio.run(control.replay([entry], endpoint, read_up_to=4)) == []
    plain_grpc = _grpc_load(2, pb.RepositoryModelLoadRequest(model_name="counted"))
    assert asyncio.run(control.replay([plain_grpc], endpoint, read_up_to=4)) == []
    assert _loads(loads) == before


@pytest.mark.parametrize(
    "entry, read_up_to",
    [
        (_rest_load(5), 4),  # recorded after the child began to start
        (_rest_load(3), 0),  # the router did not say what it had recorded
        (_grpc_load(3, pb.RepositoryModelLoadRequest(model_name="counted")), 0),
    ],
    ids=["recorded-later", "unknown-start", "grpc-unknown-start"],
)
def test_a_load_the_start_may_not_have_read_is_replayed(
    child: tuple[Endpoint, Path], entry: control.Entry, read_up_to: int
) -> None:
    endpoint, loads = child
    before = _loads(loads)
    assert asyncio.run(control.replay([entry], endpoint, read_up_to=read_up_to)) == []
    assert _loads(loads) == before + 1


def test_a_load_with_a_config_is_replayed(child: tuple[Endpoint, Path]) -> None:
    endpoint, loads = child
    before = _loads(loads)
    tensor = {"data_type": "TYPE_FP32", "dims": [1]}
    config = json.dumps(
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "x", **tensor}],
            "output": [{"name": "y", **tensor}],
        }
    )
    body = json.dumps({"parameters": {"config": config}}).encode()
    assert asyncio.run(control.replay([_rest_load(1, body)], endpoint, read_up_to=4)) == []
    assert _loads(loads) == before + 1


def test_an_unload_and_a_model_the_start_did_not_load_are_replayed(
    child: tuple[Endpoint, Path],
) -> None:
    endpoint, loads = child
    unload = control.Entry(1, "counted", REST, "/v2/repository/models/counted/unload", b"")
    assert asyncio.run(control.replay([unload], endpoint, read_up_to=4)) == []
    before = _loads(loads)
    # Now not loaded: a plain load recorded before the start is sent.
    assert asyncio.run(control.replay([_rest_load(2)], endpoint, read_up_to=4)) == []
    assert _loads(loads) == before + 1
