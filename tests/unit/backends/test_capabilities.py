"""Each backend declares its capabilities; the serving core reads them instead of probing."""

from __future__ import annotations

from pathlib import Path

from tests.toolkit.models import identity_graph, save_onnx

from dlscale.backends import Backend, BackendOptions, Capabilities, create_backend
from dlscale.types import Datatype, TensorSpec

X = TensorSpec("x", Datatype.FP32, (-1, 4))


def test_the_null_backend_takes_one_host_batch_at_a_time() -> None:
    backend = create_backend("null", Path("model.null"), BackendOptions(inputs=(X,), outputs=(X,)))
    backend.load()
    assert isinstance(backend, Backend)
    # Computing nothing, its batches may move to the event loop once measured cheap
    # (`InlineRows`); with a delay standing in for a device's time, never.
    assert backend.capabilities == Capabilities(inline_measured=True)
    options = BackendOptions(inputs=(X,), outputs=(X,), extra={"delay_us": 50})
    delayed = create_backend("null", Path("model.null"), options)
    delayed.load()
    assert delayed.capabilities == Capabilities()


def test_onnxruntime_on_the_cpu_takes_host_arrays_one_batch_at_a_time(tmp_path: Path) -> None:
    model = save_onnx(identity_graph(), tmp_path / "m.onnx")
    backend = create_backend("onnxruntime", model, BackendOptions(max_batch_size=8))
    backend.load()
    caps = backend.capabilities
    assert (caps.concurrency, caps.device_buffers) == (1, None)
    assert not caps.streams_answers and not caps.calls_models
    backend.unload()
