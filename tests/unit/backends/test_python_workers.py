"""Worker processes of the python backend, and what they exchange: tensors through shared memory
(numeric arrays never pickled), a killed worker restarted, pb_utils importable by its name."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.python_models import ADD_SUB, write_triton_python_model

from dlscale.backends import BackendOptions
from dlscale.backends.python import PythonBackend
from dlscale.backends.python import transport as t
from dlscale.backends.python import triton_python_backend_utils as pb
from dlscale.backends.python.binding import bind_caller
from dlscale.backends.python.loader import UserCodeError
from dlscale.backends.python.worker import WorkerRunner
from dlscale.errors import BackendError, DlscaleError, InvalidInput, NotFound
from dlscale.types import Datatype, InferenceRequest, InferenceResponse, TensorSpec
from dlscale.wire import channel
from dlscale.wire.segments import scope_prefix

PAIR = (TensorSpec("INPUT0", Datatype.FP32, (-1, 4)), TensorSpec("INPUT1", Datatype.FP32, (-1, 4)))
OUTS = (
    TensorSpec("OUTPUT0", Datatype.FP32, (-1, 4)),
    TensorSpec("OUTPUT1", Datatype.FP32, (-1, 4)),
)


def test_numeric_tensors_travel_in_shared_memory_not_in_the_message() -> None:
    ours, theirs = multiprocessing.Pipe()
    server, worker = (
        t.Pipe(ours, scope_prefix("test-arena-s")),
        t.Pipe(theirs, scope_prefix("test-arena-w")),
    )
    big = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    words = np.array([b"a", b"bc"], dtype=object)
    requests = [{"big": big, "words": words}, {"empty": np.zeros((0, 3), np.int8)}]
    server.send(t.Run(requests), *requests)
    assert theirs.poll(5)
    frame = theirs.recv_bytes()
    assert len(frame) < 2048  # the 256 KiB stay out of the pipe
    arena = _segment_of(frame)
    ours.send_bytes(frame)  # back into the pipe for the worker's side to read
    first, second = channel.expect(t.Run, worker.receive()).requests
    np.testing.assert_array_equal(first["big"], big)
    assert first["big"].flags.writeable and first["big"].flags.aligned
    assert list(first["words"]) == [b"a", b"bc"]
    assert second["empty"].shape == (0, 3)
    # The segment is reused while messages fit, and replaced by a larger one when not.
    server.send(t.Run([{"big": -big}]), {"big": -big})
    assert _segment_of(theirs.recv_bytes()) == arena
    huge = {"huge": np.ones(1 << 20, np.float32)}
    server.send(t.Run([huge]), huge)
    frame = theirs.recv_bytes()
    assert _segment_of(frame) != arena and not Path("/dev/shm", arena).exists()
    ours.send_bytes(frame)
    np.testing.assert_array_equal(worker.receive().requests[0]["huge"], huge["huge"])
    worker.close()
    server.close()
    assert not Path("/dev/shm", _segment_of(frame)).exists()


def _sides(ours: Connection, theirs: Connection) -> tuple[t.Pipe, t.Pipe]:
    """The server's and the worker's side of a pipe, as a worker and its server hold them."""
    return t.Pipe(ours, scope_prefix("test-pipe-s")), t.Pipe(theirs, scope_prefix("test-pipe-w"))


def _segment_of(frame: bytes) -> str:
    """The segment a frame's first out-of-band tensor lies in."""
    _, meta_size = channel.FRAME.unpack_from(frame)
    descriptors = pickle.loads(frame[channel.FRAME.size : channel.FRAME.size + meta_size])
    return str(descriptors[0][0])


def test_errors_cross_the_pipe_with_their_kind_and_trace() -> None:
    ours, theirs = multiprocessing.Pipe()
    server, worker = (
        t.Pipe(ours, scope_prefix("test-err-s")),
        t.Pipe(theirs, scope_prefix("test-err-w")),
    )
    worker.send(t.Done([InvalidInput("bad row"), UserCodeError("raised", "Traceback ...")]))
    bad, raised = channel.expect(t.Done, server.receive()).results
    assert isinstance(bad, InvalidInput) and str(bad) == "bad row"
    assert isinstance(raised, UserCodeError) and raised.trace == "Traceback ..."

    class Unpicklable(BackendError):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a} {b}")

    assert type(channel.portable(Unpicklable(1, 2))) is DlscaleError
    worker.close()
    server.close()


def test_pb_utils_is_importable_by_tritons_name_once_a_model_loads(tmp_path: Path) -> None:
    folder = write_triton_python_model(tmp_path, "pair", ADD_SUB, "")
    options = BackendOptions(extra={"isolation": "thread"}, inputs=PAIR, outputs=OUTS)
    backend = PythonBackend(folder / "1" / "model.py", options)
    backend.load()
    assert sys.modules["triton_python_backend_utils"] is pb
    backend.unload()


def test_bls_errors_come_back_as_error_responses() -> None:
    class Refusing:
        def infer(self, request: InferenceRequest) -> InferenceResponse:
            raise NotFound(f"unknown model {request.model_name!r}")

    bind_caller(Refusing())
    try:
        answer = pb.InferenceRequest(model_name="ghost", inputs=[]).exec()
    finally:
        bind_caller(None)
    error = answer.error()
    assert answer.has_error() and error is not None
    assert error.code() == pb.TritonError.NOT_FOUND and "ghost" in error.message()


def test_a_killed_worker_fails_its_batch_and_is_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_triton_python_model(tmp_path, "pair", ADD_SUB, "")
    backend = PythonBackend(folder / "1" / "model.py", BackendOptions(inputs=PAIR, outputs=OUTS))
    backend.load()
    runner = backend._runner
    assert isinstance(runner, WorkerRunner)
    first = runner.pid
    assert first is not None and first != os.getpid()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(backend.infer({"INPUT0": x, "INPUT1": x})["OUTPUT0"], 2 * x)
    with caplog.at_level(logging.WARNING, logger="dlscale.python"):
        os.kill(first, signal.SIGKILL)
        for _ in range(1200):  # the watchdog notices and starts a new worker
            if runner.pid not in (None, first):
                break
            time.sleep(0.05)
        answer = backend.infer({"INPUT0": x, "INPUT1": x})
    np.testing.assert_array_equal(answer["OUTPUT0"], 2 * x)
    assert runner.pid not in (None, first)
    assert "worker process restarted" in caplog.text
    backend.unload()


#: Calls a model from initialize (BLS) and answers every request with what it got.
ASKS_AT_START = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        x = pb_utils.Tensor("x", np.ones((1, 4), np.float32))
        answer = pb_utils.InferenceRequest(model_name="other", inputs=[x]).exec()
        self.got = pb_utils.get_output_tensor_by_name(answer, "y").as_numpy()

    def execute(self, requests):
        outputs = [pb_utils.Tensor("OUTPUT0", self.got), pb_utils.Tensor("OUTPUT1", self.got)]
        return [pb_utils.InferenceResponse(outputs) for _ in requests]
"""


class Doubling:
    """A ModelCaller standing in for the server: answers y = 2 x for any model."""

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(request.model_name, {"y": 2 * request.inputs["x"]})


def test_a_worker_calls_models_from_initialize_through_the_server(tmp_path: Path) -> None:
    folder = write_triton_python_model(tmp_path, "asks", ASKS_AT_START, "")
    options = BackendOptions(inputs=PAIR, outputs=OUTS, caller=Doubling())
    backend = PythonBackend(folder / "1" / "model.py", options)
    backend.load()
    x = np.zeros((1, 4), np.float32)
    answer = backend.infer({"INPUT0": x, "INPUT1": x})
    np.testing.assert_array_equal(answer["OUTPUT0"], np.full((1, 4), 2, np.float32))
    backend.unload()
