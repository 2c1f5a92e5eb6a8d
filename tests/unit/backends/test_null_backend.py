"""The null backend: echoes inputs or answers zeros, refuses what it cannot serve, and sleeps."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.null import NullBackend
from dlscale.errors import ConfigError
from dlscale.types import Datatype, TensorSpec

X = TensorSpec("x", Datatype.FP32, (-1, 4))
TEXT = TensorSpec("text", Datatype.BYTES, (-1, 2))


def _backend(
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    max_batch_size: int = 8,
    **extra: Any,
) -> NullBackend:
    options = BackendOptions(
        max_batch_size=max_batch_size, extra=extra, inputs=inputs, outputs=outputs
    )
    backend = create_backend("null", Path("model.null"), options)
    assert isinstance(backend, NullBackend)
    backend.load()
    return backend


def test_outputs_like_their_inputs_echo_them_without_a_copy() -> None:
    y = TensorSpec("y", Datatype.FP32, (-1, 4))
    echo = TensorSpec("echo", Datatype.BYTES, (-1, 2))
    backend = _backend((X, TEXT), (y, echo))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = np.array([[b"a", b""], [b"b", b"c"], [b"d", b"e"]], dtype=object)
    out = backend.infer({"x": x, "text": text})
    assert out["y"] is x and out["echo"] is text
    assert backend.inputs == [X, TEXT] and backend.outputs == [y, echo]


def test_other_outputs_are_zeros_of_their_declared_shape() -> None:
    wide = TensorSpec("wide", Datatype.INT64, (-1, 3, 5))
    words = TensorSpec("words", Datatype.BYTES, (-1, 2))
    backend = _backend((X,), (wide, words))
    out = backend.infer({"x": np.ones((2, 4), np.float32)})
    assert out["wide"].dtype == np.int64 and out["wide"].shape == (2, 3, 5)
    assert not out["wide"].any()
    assert out["words"].shape == (2, 2) and out["words"].tolist() == [[b"", b""], [b"", b""]]


def test_an_unbatched_model_answers_its_exact_shapes() -> None:
    x = TensorSpec("x", Datatype.FP32, (2, 3))
    same = TensorSpec("same", Datatype.FP32, (2, 3))
    flags = TensorSpec("flags", Datatype.BOOL, (4,))
    backend = _backend((x,), (same, flags), max_batch_size=0)
    value = np.ones((2, 3), np.float32)
    out = backend.infer({"x": value})
    assert out["same"] is value
    assert out["flags"].dtype == np.bool_ and out["flags"].shape == (4,)


@pytest.mark.parametrize(
    ("inputs", "outputs", "extra", "message"),
    [
        ((), (X,), {}, "needs [[inputs]] and [[outputs]]"),
        ((X,), (), {}, "needs [[inputs]] and [[outputs]]"),
        ((X,), (TensorSpec("z", Datatype.FP32, (-1, -1)),), {}, "needs fixed dimensions"),
        ((X,), (X,), {"delay_ms": 3}, "takes only ['delay_us', 'delay_us_per_row']"),
        ((X,), (X,), {"delay_us": -1}, "'backend_options.delay_us': expected microseconds"),
        ((X,), (X,), {"delay_us_per_row": "5"}, "expected microseconds >= 0, got '5'"),
        ((X,), (X,), {"delay_us": True}, "expected microseconds >= 0, got True"),
    ],
)
def test_what_it_cannot_serve_is_a_config_error(
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    extra: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ConfigError) as info:
        _backend(inputs, outputs, **extra)
    assert message in str(info.value)


def test_the_delay_is_per_batch_plus_per_row() -> None:
    backend = _backend((X,), (X,), delay_us=20_000, delay_us_per_row=5_000)
    assert (backend.delay_us, backend.delay_us_per_row) == (20_000.0, 5_000.0)
    start = time.perf_counter()
    backend.infer({"x": np.zeros((4, 4), np.float32)})
    # A lower bound only: sleeping never takes less than asked.
    assert time.perf_counter() - start >= 0.040


def test_models_naming_one_simulated_device_hold_it_one_at_a_time() -> None:
    """Two models' batches on one simulated device run one after the other: the last of four
    50 ms batches started together ends no sooner than 200 ms after they started (a lower
    bound: sleeps never end early, so a loaded machine cannot make this fail)."""
    first = _backend((X,), (X,), delay_us=50_000, simulated_device="unit-sim")
    second = _backend((X,), (X,), delay_us=50_000, simulated_device="unit-sim")
    assert first.device is second.device
    row = {"x": np.ones((1, 4), np.float32)}
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: b.infer(row), [first, second, first, second]))
    assert time.perf_counter() - start >= 4 * 0.050


def test_a_simulated_device_needs_a_name() -> None:
    with pytest.raises(ConfigError, match=r"backend_options\.simulated_device"):
        _backend((X,), (X,), simulated_device=3)
