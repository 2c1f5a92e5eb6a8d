"""FLOPs of torch backend model files (torch's flop counter), against the ONNX counter's MACs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlscale.models.flops import count, count_file

torch = pytest.importorskip("torch")

from dlscale.backends.torch.files import save_exported, write_module_spec  # noqa: E402
from dlscale.models.zoo import ZOO  # noqa: E402
from dlscale.models.zoo.model import TRACE_SEED, WEIGHT_SEED  # noqa: E402


def _specs(name: str) -> tuple[list, list]:  # type: ignore[type-arg]
    model = ZOO[name]
    return [s.with_batch() for s in model.inputs()], [s.with_batch() for s in model.outputs()]


def test_a_zoo_module_counts_its_products_as_the_onnx_counter_does(
    small_repo: Path, tmp_path: Path
) -> None:
    inputs, outputs = _specs("mlp")
    spec = tmp_path / "model.zoo"
    write_module_spec(spec, ZOO["mlp"].factory, {"seed": WEIGHT_SEED}, inputs, outputs)
    torch_cost = count_file(spec)
    onnx_cost = count(small_repo / "mlp" / "1" / "model.onnx")
    # torch counts matrix products only: 2 FLOPs per MAC, the biases and ReLUs left out.
    assert torch_cost.flops == 2 * onnx_cost.macs == 2 * (256 * 1024 + 1024 * 1024 + 1024 * 10)
    assert torch_cost.weight_params == onnx_cost.weight_params
    assert torch_cost.io_elements == onnx_cost.io_elements == 256 + 10
    # Two hidden layers of 1024 written by the products and again by the ReLUs (at least).
    assert torch_cost.activation_elements >= 2 * 1024
    assert torch_cost.uncounted == ("elementwise ops",)


def test_an_exported_convolutional_program_counts_its_convolutions(
    small_repo: Path, tmp_path: Path
) -> None:
    inputs, outputs = _specs("digits")
    example = ZOO["digits"].sample(2, np.random.default_rng(TRACE_SEED))
    path = tmp_path / "model.pt2"
    save_exported(ZOO["digits"].torch_module(), example, inputs, outputs, path)
    assert count_file(path).flops == 2 * count(small_repo / "digits" / "1" / "model.onnx").macs
