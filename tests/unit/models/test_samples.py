"""Inputs made from tensor specs: shapes, datatypes, seeds, the zoo's generator, stored sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlscale.models.samples import (
    concrete_shape,
    inputs_for,
    random_inputs,
    stored_inputs,
    zero_inputs,
    zoo_inputs,
)
from dlscale.models.zoo import ZOO
from dlscale.types import Datatype, TensorSpec

SPECS = [
    TensorSpec("image", Datatype.FP32, (-1, 3, -1)),
    TensorSpec("ids", Datatype.INT64, (-1, 5)),
    TensorSpec("mask", Datatype.BOOL, (-1, 2)),
    TensorSpec("text", Datatype.BYTES, (-1, 2)),
]


def test_a_leading_variable_dim_is_the_batch_and_the_others_take_the_variable_length() -> None:
    assert concrete_shape((-1, 3, -1), 4) == [4, 3, 1]
    assert concrete_shape((-1, 3, -1), 4, variable_dim=8) == [4, 3, 8]
    assert concrete_shape((2, -1), 4, variable_dim=8) == [2, 8]  # no batch axis: nothing takes 4


def test_random_inputs_follow_the_specs_and_the_seed() -> None:
    made = random_inputs(SPECS, 3, np.random.default_rng(5))
    assert {k: (v.shape, v.dtype) for k, v in made.items()} == {
        "image": ((3, 3, 1), np.dtype(np.float32)),
        "ids": ((3, 5), np.dtype(np.int64)),
        "mask": ((3, 2), np.dtype(bool)),
        "text": ((3, 2), np.dtype(object)),
    }
    assert made["ids"].min() >= 0 and made["ids"].max() < 100
    assert made["text"].ravel().tolist() == [f"sample-{i}".encode() for i in range(6)]
    again = random_inputs(SPECS, 3, np.random.default_rng(5))
    assert all(np.array_equal(made[k], again[k]) for k in made)
    other = random_inputs(SPECS, 3, np.random.default_rng(6))
    assert not np.array_equal(made["image"], other["image"])


def test_zero_inputs_are_zeros_and_empty_strings() -> None:
    made = zero_inputs(SPECS, 2)
    assert made["image"].shape == (2, 3, 1) and not made["image"].any()
    assert made["ids"].dtype == np.int64 and made["text"].ravel().tolist() == [b""] * 4
    assert zero_inputs([TensorSpec("x", Datatype.FP16, (-1, 4))], 0)["x"].shape == (0, 4)


def test_the_zoo_generator_only_answers_for_a_zoo_model_whose_inputs_fit() -> None:
    specs = [s.with_batch() for s in ZOO["mlp"].inputs()]
    made = zoo_inputs("mlp", specs, 4, np.random.default_rng(0))
    assert made is not None and made["input"].shape == (4, 256)
    assert np.array_equal(made["input"], ZOO["mlp"].sample(4, np.random.default_rng(0))["input"])
    assert zoo_inputs("not-in-the-zoo", specs, 4, np.random.default_rng(0)) is None
    other = [TensorSpec("input", Datatype.FP32, (-1, 7))]  # shares the name, not the inputs
    assert zoo_inputs("mlp", other, 4, np.random.default_rng(0)) is None
    # The sample specs of a batched model leave the batch axis out: they do not fit a batch.
    assert zoo_inputs("mlp", ZOO["mlp"].inputs(), 4, np.random.default_rng(0)) is None


def test_stored_rows_come_first_then_the_zoo_then_random(tmp_path: Path) -> None:
    specs = [TensorSpec("input", Datatype.FP32, (-1, 256))]
    rows = np.arange(10 * 256, dtype=np.float32).reshape(10, 256)
    assert stored_inputs(tmp_path) is None
    np.savez(tmp_path / "validation.npz", input=rows, labels=np.arange(10))
    assert set(stored_inputs(tmp_path) or {}) == {"input", "labels"}
    picked = inputs_for("mlp", tmp_path, specs, 3, np.random.default_rng(0))["input"]
    assert picked.shape == (3, 256) and all(any((r == rows).all(1)) for r in picked)
    empty = tmp_path / "empty"
    empty.mkdir()
    zoo = inputs_for("mlp", empty, specs, 3, np.random.default_rng(0))["input"]
    assert np.array_equal(zoo, ZOO["mlp"].sample(3, np.random.default_rng(0))["input"])
    plain = inputs_for("plain", empty, specs, 3, np.random.default_rng(0))["input"]
    assert np.array_equal(plain, random_inputs(specs, 3, np.random.default_rng(0))["input"])
