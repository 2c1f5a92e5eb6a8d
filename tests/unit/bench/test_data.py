"""The bench's samples: the user's file with labels, the zoo's generator, random within a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlscale.bench.data import MEMORY_BUDGET_BYTES, VARIABLE_DIM, load_samples
from dlscale.bench.targets import ModelInfo
from dlscale.errors import BenchError
from dlscale.models.zoo import ZOO
from dlscale.types import Datatype, TensorSpec


def _info(name: str, *specs: TensorSpec, batched: bool = True) -> ModelInfo:
    return ModelInfo(name, specs, (), batched)


def test_a_remote_zoo_model_gets_the_zoo_generator() -> None:
    mlp = _info("mlp", *(s.with_batch() for s in ZOO["mlp"].inputs()))
    samples = load_samples(mlp, None, 6, seed=2)
    assert samples.source == "zoo:mlp" and len(samples) == 6
    want = ZOO["mlp"].sample(6, np.random.default_rng(2))["input"]
    assert np.array_equal(samples.inputs["input"], want)


def test_made_up_samples_give_variable_dims_their_bench_length() -> None:
    info = _info(
        "plain",
        TensorSpec("tokens", Datatype.INT32, (-1, -1)),
        TensorSpec("text", Datatype.BYTES, (-1, 2)),
    )
    samples = load_samples(info, None, 5, seed=0)
    assert samples.source == "random"
    assert samples.inputs["tokens"].shape == (5, VARIABLE_DIM)
    assert samples.inputs["text"][0].tolist() == [b"sample-0", b"sample-1"]
    unbatched = load_samples(
        _info("plain", TensorSpec("x", Datatype.FP32, (-1,)), batched=False), None, 3
    )
    assert unbatched.inputs["x"].shape == (3, VARIABLE_DIM)


def test_the_sample_count_fits_the_memory_budget() -> None:
    row = MEMORY_BUDGET_BYTES // 4 // 10  # FP32 elements in a tenth of the budget
    info = _info("plain", TensorSpec("x", Datatype.FP32, (-1, row)))
    assert len(load_samples(info, None, 1000)) == 10


def test_the_users_npz_gives_inputs_and_labels(tmp_path: Path) -> None:
    info = _info("plain", TensorSpec("x", Datatype.FP32, (-1, 4)))
    path = tmp_path / "data.npz"
    np.savez(path, features=np.ones((3, 4), np.float64), labels=np.array([0, 1, 2]))
    samples = load_samples(info, path, 100)
    assert samples.source == str(path) and len(samples) == 3
    assert samples.inputs["x"].dtype == np.float32 and samples.labels is not None
    with pytest.raises(BenchError, match="does not exist"):
        load_samples(info, tmp_path / "missing.npy", 100)
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(BenchError, match=r"not a \.npy or \.npz file"):
        load_samples(info, tmp_path / "bad.npy", 100)
