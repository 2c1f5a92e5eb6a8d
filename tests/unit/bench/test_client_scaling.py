"""The pieces of a bench that outruns its server: concurrency ranges, worker shares, null twins."""

from __future__ import annotations

import tomllib

import pytest

from dlscale.bench.ceiling import SATURATED_SHARE, Ceiling, null_config
from dlscale.bench.sweep import parse_concurrency
from dlscale.bench.targets import ModelInfo
from dlscale.bench.workers import shares
from dlscale.errors import BenchError
from dlscale.types import Datatype, TensorSpec


@pytest.mark.parametrize(
    ("text", "single", "points"),
    [
        (None, None, ()),
        ("6", 6, ()),
        ("1:64", None, (1, 2, 4, 8, 16, 32, 64)),
        ("3:20", None, (3, 6, 12, 20)),
        ("4:4", None, (4,)),
        ("4:16:4", None, (4, 8, 12, 16)),
        ("1:10:4", None, (1, 5, 9, 10)),
    ],
)
def test_concurrency_is_one_value_or_a_range(
    text: str | None, single: int | None, points: tuple[int, ...]
) -> None:
    assert parse_concurrency(text) == (single, points)


def test_a_backwards_range_is_refused() -> None:
    with pytest.raises(BenchError, match="START <= END"):
        parse_concurrency("16:4")


@pytest.mark.parametrize(("concurrency", "workers"), [(4, 2), (5, 2), (1, 3), (64, 7)])
def test_worker_shares_add_up_to_the_concurrency(concurrency: int, workers: int) -> None:
    parts = shares(concurrency, workers)
    assert len(parts) == workers and sum(parts) == concurrency
    assert max(parts) - min(parts) <= 1


def test_the_null_twin_declares_the_same_tensors_without_the_batch_dimension() -> None:
    info = ModelInfo(
        "resnet",
        (TensorSpec("x", Datatype.FP32, (-1, 3, 224, 224)),),
        (TensorSpec("y", Datatype.FP32, (-1, 1000)), TensorSpec("s", Datatype.BYTES, (-1, 1))),
        batched=True,
        max_batch_size=None,
    )
    config = tomllib.loads(null_config(info, 32))
    assert config["backend"] == "null" and config["max_batch_size"] == 32
    assert config["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [3, 224, 224]}]
    assert [o["shape"] for o in config["outputs"]] == [[1000], [1]]
    unbatched = ModelInfo("m", info.inputs[:1], info.outputs[:1], batched=False)
    config = tomllib.loads(null_config(unbatched, 32))
    assert config["max_batch_size"] == 0 and config["inputs"][0]["shape"] == [-1, 3, 224, 224]


def test_a_run_near_the_ceiling_is_client_bound() -> None:
    ceiling = Ceiling(1000.0, "test")
    assert ceiling.bound(1000.0 * SATURATED_SHARE) is True
    assert ceiling.bound(1000.0 * SATURATED_SHARE * 0.99) is False
    assert Ceiling(None, "test", error="no server").bound(5.0) is None
    assert ceiling.bound(None) is None
