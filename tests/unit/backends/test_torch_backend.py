"""Every zoo model through the torch backend, checked against the ONNX Runtime backend.

What runs here, on 2 CPU cores, and why (docs/backends.md has the timings):
- eager, FP32 and BF16: all five zoo models;
- torch.compile with inductor, FP32 and BF16: identity, mlp and digits. Inductor on resnet50 and
  bert-base takes 55-80 s per model and precision on 2 cores, so there they compile with the
  "aot_eager" backend (the same dynamo capture and AOT graph, without generating kernels) in
  FP32; the inductor runs of the two are below, `slow` and run only with DLSCALE_SLOW_TESTS=1
  (`make test-slow` sets it).
Tolerances, as the largest difference over the largest reference magnitude: FP32 5e-4
(measured ≤ 2e-5); BF16 0.25 and a cosine similarity ≥ 0.99 (measured on resnet50, the worst:
0.11 and 0.9939, its 53 layers of random weights each rounding to 8 bits of mantissa).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch import TorchBackend
from dlscale.backends.torch.files import save_exported, write_module_spec
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.model import TRACE_SEED, WEIGHT_SEED
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

Arrays = dict[str, np.ndarray]
SLOW = os.environ.get("DLSCALE_SLOW_TESTS") == "1"
ROWS = 3  # odd, so that a bucketed run pads


@pytest.fixture(scope="module")
def zoo(small_repo: Path, big_zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's ONNX repository, plus each model's torch file beside its ONNX.

    The ONNX files are the session's builds (tests/conftest.py), copied so that the torch files
    can be added. digits trains at build time (about 8 s), so its torch file is a model.pt2
    exported once from its module rather than a model.zoo that would train again on every load.
    """
    root = tmp_path_factory.mktemp("zoo")
    for source in (small_repo, big_zoo):
        for folder in source.iterdir():
            shutil.copytree(folder, root / folder.name)
    assert sorted(p.name for p in root.iterdir()) == sorted(ZOO)
    for model in ZOO.values():
        inputs = [s.with_batch() for s in model.inputs()]
        outputs = [s.with_batch() for s in model.outputs()]
        folder = root / model.name / "1"
        if model.name == "digits":
            example = model.sample(2, np.random.default_rng(TRACE_SEED))
            save_exported(model.torch_module(), example, inputs, outputs, folder / "model.pt2")
        else:
            write_module_spec(
                folder / "model.zoo", model.factory, {"seed": WEIGHT_SEED}, inputs, outputs
            )
    return root


@pytest.fixture(scope="module")
def references(zoo: Path) -> dict[str, tuple[Arrays, Arrays]]:
    """(inputs, ONNX Runtime outputs) of ROWS samples per model."""
    out = {}
    for model in ZOO.values():
        inputs = model.sample(ROWS, np.random.default_rng(7))
        ort = create_backend("onnxruntime", zoo / model.name / "1" / "model.onnx", BackendOptions())
        ort.load()
        out[model.name] = (inputs, ort.infer(inputs))
        ort.unload()
    return out


def torch_file(zoo: Path, name: str) -> Path:
    folder = zoo / name / "1"
    return folder / "model.pt2" if (folder / "model.pt2").exists() else folder / "model.zoo"


def loaded(
    zoo: Path, name: str, max_batch_size: int | None = None, **extra: Any
) -> Iterator[TorchBackend]:
    """The model's torch backend, loaded, for one `for` loop (unloaded after it)."""
    options = BackendOptions(max_batch_size=max_batch_size or ZOO[name].max_batch_size, extra=extra)
    backend = create_backend("torch", torch_file(zoo, name), options)
    assert isinstance(backend, TorchBackend)
    backend.load()
    try:
        yield backend
    finally:
        backend.unload()


def assert_close(got: Arrays, expected: Arrays, precision: str) -> None:
    assert sorted(got) == sorted(expected)
    for name, ref in expected.items():
        out = got[name]
        assert out.shape == ref.shape and out.dtype == ref.dtype, name
        scale = max(float(np.abs(ref).max()), 1e-6)
        error = float(np.abs(out - ref).max()) / scale
        if precision == "fp32":
            assert error <= 5e-4, f"{name}: FP32 relative error {error:.2e}"
        else:
            cosine = float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref)))
            assert error <= 0.25 and cosine >= 0.99, f"{name}: error {error:.3f} cos {cosine:.5f}"


CASES = [
    pytest.param(name, compiled, precision, id=f"{name}-{compiled or 'eager'}-{precision}")
    for name in ZOO
    for compiled in (None, "inductor" if name in ("identity", "mlp", "digits") else "aot_eager")
    for precision in ("fp32", "bf16")
    if not (compiled == "aot_eager" and precision == "bf16")
] + [
    pytest.param(
        name,
        "inductor",
        precision,
        id=f"{name}-inductor-{precision}",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(
                not SLOW, reason="minutes on 2 cores: `make test-slow` (DLSCALE_SLOW_TESTS=1)"
            ),
        ],
    )
    for name in ("resnet50", "bert-base")
    for precision in ("fp32", "bf16")
]


@pytest.mark.parametrize(("name", "compiled", "precision"), CASES)
def test_a_zoo_model_matches_onnxruntime(
    zoo: Path,
    references: dict[str, tuple[Arrays, Arrays]],
    name: str,
    compiled: str | None,
    precision: str,
) -> None:
    inputs, expected = references[name]
    extra: dict[str, Any] = {"precision": precision}
    if compiled:
        extra |= {"compile": True, "compile_backend": compiled}
    for backend in loaded(zoo, name, **extra):
        assert_close(backend.infer(inputs), expected, precision)


def test_autocast_keeps_fp32_weights_and_matches(
    zoo: Path, references: dict[str, tuple[Arrays, Arrays]]
) -> None:
    inputs, expected = references["mlp"]
    for backend in loaded(zoo, "mlp", precision="bf16", autocast=True):
        first = next(p for p in backend._module.parameters())
        assert str(first.dtype) == "torch.float32"
        assert_close(backend.infer(inputs), expected, "bf16")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bucket_padding_returns_exactly_the_rows_asked_for(zoo: Path, compiled: bool) -> None:
    model = ZOO["mlp"]
    batch = model.sample(8, np.random.default_rng(3))
    for plain in loaded(zoo, "mlp"):
        expected = plain.infer(batch)["output"]
    buckets = [2, 8] if compiled else [1, 4, 8]
    extra = {"static_buckets": True, "batch_buckets": buckets, "compile": compiled}
    for backend in loaded(zoo, "mlp", max_batch_size=8, **extra):
        assert backend.buckets is not None and backend.buckets.sizes == tuple(buckets)
        for rows in range(1, 9):
            got = backend.infer({"input": batch["input"][:rows]})["output"]
            assert got.shape == (rows, 10)
            np.testing.assert_allclose(got, expected[:rows], rtol=1e-4, atol=1e-5)


async def test_a_torch_model_loads_and_serves_through_the_dataplane(
    zoo: Path, references: dict[str, tuple[Arrays, Arrays]], tmp_path: Path
) -> None:
    folder = tmp_path / "mlp-torch"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.zoo").write_bytes((zoo / "mlp" / "1" / "model.zoo").read_bytes())
    config = {
        "backend": "torch",
        "max_batch_size": 8,
        "batching": {"max_queue_delay_us": 20_000},
        "backend_options": {"static_buckets": True, "batch_buckets": [4, 8]},
    }
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    inputs, expected = references["mlp"]
    manager = ModelManager.open(tmp_path)
    await manager.load_all()
    plane = DataPlane(manager)
    try:
        assert await plane.model_ready("mlp-torch")
        # Two requests of 3 and 2 rows: merged or not, each gets exactly its own rows.
        three, two = await asyncio.gather(
            plane.infer(InferenceRequest("mlp-torch", {"input": inputs["input"]})),
            plane.infer(InferenceRequest("mlp-torch", {"input": inputs["input"][:2]})),
        )
    finally:
        await manager.close()
    np.testing.assert_allclose(three.outputs["output"], expected["output"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(two.outputs["output"], expected["output"][:2], rtol=1e-4, atol=1e-6)
