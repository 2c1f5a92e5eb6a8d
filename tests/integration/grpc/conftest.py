"""A real gRPC server on 127.0.0.1 port 0 over small ONNX models, for tritonclient to talk to.

The core and the frontend run on an event loop of their own in a background thread, so that the
blocking tritonclient.grpc client and the asyncio one (on pytest's loop) both reach it over the
network as any client would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as triton
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2_grpc

from dlscale.frontends.grpc import GrpcFrontend
from dlscale.models.repository import ModelRepository
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

T = TypeVar("T")

#: Deterministic weights of the mlp model; tests compute the expected answer from them.
RNG = np.random.default_rng(7)
MLP_W = RNG.standard_normal((16, 8)).astype(np.float32)
MLP_B = RNG.standard_normal(8).astype(np.float32)
#: The fragile model fails whenever a batch holds exactly this many rows.
FRAGILE_ROWS = 3
#: The frontend with a small message limit, for the size-limit tests.
SMALL_LIMIT = 16 * 1024
WIDEN = 64


def _value(name: str, elem: int, shape: list[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def write_model(root: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.toml").write_text(config)


def identity_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [_value("x", TensorProto.FLOAT, ["N", 16])],
        [_value("y", TensorProto.FLOAT, ["N", 16])],
    )


def mlp_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["y"]),
        ],
        "mlp",
        [_value("x", TensorProto.FLOAT, ["N", 16])],
        [_value("y", TensorProto.FLOAT, ["N", 8])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [16, 8], MLP_W.ravel().tolist()),
            helper.make_tensor("b", TensorProto.FLOAT, [8], MLP_B.tolist()),
        ],
    )


def two_inputs_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["diff"]),
        ],
        "two_inputs",
        [_value("a", TensorProto.FLOAT, ["N", 4]), _value("b", TensorProto.FLOAT, ["N", 4])],
        [_value("sum", TensorProto.FLOAT, ["N", 4]), _value("diff", TensorProto.FLOAT, ["N", 4])],
    )


def ints_bytes_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("Mul", ["i", "two"], ["i2"]),
            helper.make_node("Identity", ["s"], ["s_out"]),
        ],
        "ints_bytes",
        [_value("i", TensorProto.INT64, ["N", 3]), _value("s", TensorProto.STRING, ["N", 2])],
        [_value("i2", TensorProto.INT64, ["N", 3]), _value("s_out", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor("two", TensorProto.INT64, [1], [2])],
    )


def half_graph() -> onnx.GraphProto:
    # BF16 is left out: ONNX Runtime's Python API takes no bfloat16 numpy arrays (the converter's
    # unit tests cover BF16 on the wire).
    return helper.make_graph(
        [helper.make_node("Identity", ["h"], ["h_out"])],
        "half",
        [_value("h", TensorProto.FLOAT16, ["N", 2])],
        [_value("h_out", TensorProto.FLOAT16, ["N", 2])],
    )


def unbatched_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "unbatched",
        [_value("x", TensorProto.FLOAT, [2, 3])],
        [_value("y", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor("k", TensorProto.FLOAT, [1], [2.0])],
    )


def widen_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["y"])],
        "widen",
        [_value("x", TensorProto.FLOAT, ["N", 4])],
        [_value("y", TensorProto.FLOAT, ["N", 4 * WIDEN])],
        [helper.make_tensor("reps", TensorProto.INT64, [2], [1, WIDEN])],
    )


def fragile_graph() -> onnx.GraphProto:
    """y = x, computed through a Reshape whose target is one element off when N == FRAGILE_ROWS."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
        helper.make_node("Equal", ["n", "bad"], ["is_bad"]),
        helper.make_node("Cast", ["is_bad"], ["off"], to=TensorProto.INT64),
        helper.make_node("Mul", ["n", "width"], ["size"]),
        helper.make_node("Add", ["size", "off"], ["flat_shape"]),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("Reshape", ["flat", "shape"], ["y"]),
    ]
    consts = [
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("bad", TensorProto.INT64, [1], [FRAGILE_ROWS]),
        helper.make_tensor("width", TensorProto.INT64, [1], [4]),
    ]
    return helper.make_graph(
        nodes,
        "fragile",
        [_value("x", TensorProto.FLOAT, ["N", 4])],
        [_value("y", TensorProto.FLOAT, ["N", 4])],
        consts,
    )


BATCHED = "max_batch_size = {max_batch}\n[batching]\nmax_queue_delay_us = {delay}\n"


def build_repository(root: Path) -> Path:
    """Every model the gRPC tests use, in a fresh repository folder."""
    write_model(
        root,
        "identity",
        identity_graph(),
        BATCHED.format(max_batch=32, delay=500) + "priority_levels = 2\n",
    )
    write_model(root, "mlp", mlp_graph(), BATCHED.format(max_batch=32, delay=500))
    write_model(root, "spare", identity_graph(), BATCHED.format(max_batch=8, delay=0))
    write_model(root, "two_inputs", two_inputs_graph(), BATCHED.format(max_batch=8, delay=0))
    write_model(root, "ints_bytes", ints_bytes_graph(), BATCHED.format(max_batch=8, delay=0))
    write_model(root, "half", half_graph(), BATCHED.format(max_batch=8, delay=0))
    write_model(root, "widen", widen_graph(), BATCHED.format(max_batch=32, delay=0))
    write_model(root, "unbatched", unbatched_graph(), 'platform = "onnxruntime_onnx"\n')
    # A long queue delay: requests sent together reliably share one batch.
    write_model(
        root,
        "fragile",
        fragile_graph(),
        # A strict wait: requests sent one at a time still queue for the whole delay.
        BATCHED.format(max_batch=4, delay=1_000_000) + "adaptive_queue_delay = false\n",
    )
    return root


@dataclass
class ServerThread:
    """The core and two frontends on an event loop in a background thread."""

    loop: asyncio.AbstractEventLoop
    dataplane: DataPlane
    frontend: GrpcFrontend
    small: GrpcFrontend

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.frontend.port}"

    @property
    def small_url(self) -> str:
        return f"127.0.0.1:{self.small.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = build_repository(tmp_path_factory.mktemp("grpc_repo"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-server", daemon=True)
    thread.start()

    async def start() -> ServerThread:
        manager = ModelManager(ModelRepository(root))
        await manager.load_all()
        dataplane = DataPlane(manager, model_control="explicit")
        frontend = GrpcFrontend(dataplane, "127.0.0.1", 0)
        small = GrpcFrontend(dataplane, "127.0.0.1", 0, max_message_bytes=SMALL_LIMIT)
        await frontend.start()
        await small.start()
        return ServerThread(loop, dataplane, frontend, small)

    running = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=120)
    yield running

    async def stop() -> None:
        await running.frontend.stop(1.0)
        await running.small.stop(1.0)
        await running.dataplane.manager.close()

    running.call(stop())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


@pytest.fixture
def client(server: ServerThread) -> Iterator[triton.InferenceServerClient]:
    """tritonclient's blocking client."""
    c = triton.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture
def stub(server: ServerThread) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's own generated stub, for messages its high-level client never sends."""
    with grpc.insecure_channel(server.url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer_input(name: str, array: np.ndarray) -> triton.InferInput:
    """A tritonclient input holding `array` (raw contents, as tritonclient sends them)."""
    datatype = "BYTES" if array.dtype == object else triton.np_to_triton_dtype(array.dtype)
    inp = triton.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp
