"""A repository of small real ONNX models and a real REST server on a background event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import uvloop
from onnx import TensorProto, helper, numpy_helper

from dlscale.frontends.rest import HttpFrontend
from dlscale.models.repository import ModelRepository
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

T = TypeVar("T")
F = TensorProto.FLOAT

#: The mlp's weights: deterministic, so the tests compute the reference with numpy.
_rng = np.random.default_rng(7)
MLP_W1 = _rng.standard_normal((16, 32)).astype(np.float32)
MLP_B1 = _rng.standard_normal(32).astype(np.float32)
MLP_W2 = _rng.standard_normal((32, 4)).astype(np.float32)


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """What the mlp model computes, in numpy."""
    return np.maximum(x @ MLP_W1 + MLP_B1, 0.0) @ MLP_W2


def _io(name: str, elem: int, shape: list[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _save(root: Path, name: str, graph: onnx.GraphProto, config: str, version: int = 1) -> None:
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, folder / "model.onnx")
    (root / name / "config.toml").write_text(config)


def build_repository(root: Path) -> Path:
    """Every model the REST tests use, written with onnx.helper."""
    _save(
        root,
        "identity",
        helper.make_graph(
            [helper.make_node("Identity", ["input"], ["output"])],
            "identity",
            [_io("input", F, ["batch", 16])],
            [_io("output", F, ["batch", 16])],
        ),
        "max_batch_size = 64\n[batching]\nmax_queue_delay_us = 500\n",
    )
    _save(
        root,
        "mlp",
        helper.make_graph(
            [
                helper.make_node("MatMul", ["x", "w1"], ["h0"]),
                helper.make_node("Add", ["h0", "b1"], ["h1"]),
                helper.make_node("Relu", ["h1"], ["h"]),
                helper.make_node("MatMul", ["h", "w2"], ["y"]),
            ],
            "mlp",
            [_io("x", F, ["batch", 16])],
            [_io("y", F, ["batch", 4])],
            [
                numpy_helper.from_array(MLP_W1, "w1"),
                numpy_helper.from_array(MLP_B1, "b1"),
                numpy_helper.from_array(MLP_W2, "w2"),
            ],
        ),
        "max_batch_size = 64\n[batching]\nmax_queue_delay_us = 500\n[[instances]]\ncount = 2\n",
    )
    _save(
        root,
        "two_inputs",
        helper.make_graph(
            [
                helper.make_node("Cast", ["b"], ["bf"], to=F),
                helper.make_node("Add", ["a", "bf"], ["sum"]),
                helper.make_node("Identity", ["b"], ["b_copy"]),
            ],
            "two_inputs",
            [_io("a", F, ["batch", 4]), _io("b", TensorProto.INT32, ["batch", 4])],
            [_io("sum", F, ["batch", 4]), _io("b_copy", TensorProto.INT32, ["batch", 4])],
        ),
        "max_batch_size = 8\n",
    )
    _save(
        root,
        "strings",
        helper.make_graph(
            [helper.make_node("Identity", ["text"], ["echo"])],
            "strings",
            [_io("text", TensorProto.STRING, ["batch", 2])],
            [_io("echo", TensorProto.STRING, ["batch", 2])],
        ),
        "max_batch_size = 8\n",
    )
    _save(
        root,
        "int64",
        helper.make_graph(
            [helper.make_node("Mul", ["n", "two"], ["doubled"])],
            "int64",
            [_io("n", TensorProto.INT64, ["batch", 3])],
            [_io("doubled", TensorProto.INT64, ["batch", 3])],
            [helper.make_tensor("two", TensorProto.INT64, [1], [2])],
        ),
        "max_batch_size = 8\n",
    )
    _save(
        root,
        "fixed",  # not batched: shapes are exact, no batch dimension
        helper.make_graph(
            [
                helper.make_node("Mul", ["x", "three"], ["y"]),
                helper.make_node("Not", ["flags"], ["flipped"]),
            ],
            "fixed",
            [_io("x", F, [2, 3]), _io("flags", TensorProto.BOOL, [3])],
            [_io("y", F, [2, 3]), _io("flipped", TensorProto.BOOL, [3])],
            [helper.make_tensor("three", F, [1], [3.0])],
        ),
        "max_batch_size = 0\n",
    )
    _save(
        root,
        "half",
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "half",
            [_io("x", TensorProto.FLOAT16, ["batch", 4])],
            [_io("y", TensorProto.FLOAT16, ["batch", 4])],
        ),
        "max_batch_size = 8\n",
    )
    for version, value in ((1, 1.0), (2, 2.0)):
        _save(
            root,
            "plus",
            helper.make_graph(
                [helper.make_node("Add", ["input", "c"], ["output"])],
                "plus",
                [_io("input", F, ["batch", 4])],
                [_io("output", F, ["batch", 4])],
                [helper.make_tensor("c", F, [1], [value])],
            ),
            "max_batch_size = 8\n[version_policy]\nall = true\n",
            version,
        )
    _save(
        root,
        "queued",  # a long batching delay: a request waits there, so its timeout can expire
        helper.make_graph(
            [helper.make_node("Identity", ["input"], ["output"])],
            "queued",
            [_io("input", F, ["batch", 4])],
            [_io("output", F, ["batch", 4])],
        ),
        "max_batch_size = 8\n[batching]\nmax_queue_delay_us = 300000\npriority_levels = 2\n"
        "adaptive_queue_delay = false\n",
    )
    _save(root, "fails_even", fails_on_even_batches(), "max_batch_size = 7\n")
    (root / "broken").mkdir()
    (root / "broken" / "config.toml").write_text("max_batch_size = -3\n")
    return root


def fails_on_even_batches() -> onnx.GraphProto:
    """Echoes x [N, 4]; its graph reshapes 4N+4 values to rows of 8, which fails when N is even.

    Warm-up runs batches of 1 and 7 (max_batch_size), both odd, so the model loads; a batch
    with an even number of rows makes onnxruntime raise at run time.
    """
    i64 = TensorProto.INT64
    return helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "flat"], ["xf"]),
            helper.make_node("Concat", ["xf", "pad"], ["padded"], axis=0),
            helper.make_node("Reshape", ["padded", "rows8"], ["r"]),
            helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0),
            helper.make_node("Mul", ["s", "zero"], ["z"]),
            helper.make_node("Add", ["x", "z"], ["y"]),
        ],
        "fails_even",
        [_io("x", F, ["batch", 4])],
        [_io("y", F, ["batch", 4])],
        [
            helper.make_tensor("flat", i64, [1], [-1]),
            helper.make_tensor("pad", F, [4], [0.0] * 4),
            helper.make_tensor("rows8", i64, [2], [-1, 8]),
            helper.make_tensor("zero", F, [], [0.0]),
        ],
    )


class ServerThread:
    """DataPlane and HttpFrontend on a uvloop loop in a thread, so sync clients can call it."""

    def __init__(self, root: Path, max_body_bytes: int = 4 * 2**20) -> None:
        self.root = root
        self.max_body_bytes = max_body_bytes
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.dataplane: DataPlane
        self.frontend: HttpFrontend

    def start(self) -> None:
        self._thread.start()
        self.run(self._start())

    async def _start(self) -> None:
        manager = ModelManager(ModelRepository(self.root))
        await manager.load_all()
        self.dataplane = DataPlane(manager, model_control="explicit")
        self.frontend = HttpFrontend(
            self.dataplane, "127.0.0.1", 0, max_body_bytes=self.max_body_bytes
        )
        await self.frontend.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def url(self) -> str:
        """host:port, as tritonclient wants it."""
        return f"127.0.0.1:{self.frontend.port}"

    def stop(self) -> None:
        self.run(self.frontend.stop(grace_s=5.0))
        self.run(self.dataplane.manager.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@contextmanager
def serving(root: Path, max_body_bytes: int = 4 * 2**20) -> Iterator[ServerThread]:
    """A started server over `root`, stopped on exit."""
    server = ServerThread(root, max_body_bytes)
    server.start()
    try:
        yield server
    finally:
        server.stop()
