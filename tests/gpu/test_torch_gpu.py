"""The torch backend on a CUDA GPU: precisions, CUDA graphs, channels_last, FP8, staging.

Compiled paths (AOTInductor packages, torch.compile with freezing) and 8-bit convolutions are
in test_torch_gpu_compiled.py.

Run on a GPU machine with `make test-gpu` (docs/testing.md); skipped elsewhere, saying what is
missing (a GPU, or a CUDA build of torch).
References are the ONNX Runtime backend on the CPU, as in the unit tests; tolerances are the
largest difference over the largest reference magnitude (FP32 5e-4, TF32 and FP16 0.05, BF16
0.25, FP8 0.5) with a cosine similarity floor (≥ 0.99; FP8 ≥ 0.98).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.toolkit.gpu import torch_cuda_missing

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch import TorchBackend
from dlscale.backends.torch.files import write_module_spec
from dlscale.backends.torch.precision import fp8_supported
from dlscale.errors import ConfigError
from dlscale.models.zoo import ZOO, build_zoo
from dlscale.models.zoo.model import WEIGHT_SEED
from dlscale.serving.manager import ModelManager

NO_CUDA = torch_cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA is not None, reason=str(NO_CUDA))]
Arrays = dict[str, np.ndarray]
MODELS = ("mlp", "resnet50", "bert-base")
TOLERANCE = {"fp32": (5e-4, 0.9999), "tf32": (0.05, 0.999), "fp16": (0.05, 0.999)}
TOLERANCE |= {"bf16": (0.25, 0.99), "fp8": (0.5, 0.98)}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    build_zoo(root, list(MODELS))
    for name in MODELS:
        model = ZOO[name]
        write_module_spec(
            root / name / "1" / "model.zoo",
            model.factory,
            {"seed": WEIGHT_SEED},
            [s.with_batch() for s in model.inputs()],
            [s.with_batch() for s in model.outputs()],
        )
    return root


@pytest.fixture(scope="module")
def references(zoo: Path) -> dict[str, tuple[Arrays, Arrays]]:
    out = {}
    for name in MODELS:
        inputs = ZOO[name].sample(5, np.random.default_rng(7))
        ort = create_backend("onnxruntime", zoo / name / "1" / "model.onnx", BackendOptions())
        ort.load()
        out[name] = (inputs, ort.infer(inputs))
    return out


def loaded(zoo: Path, name: str, max_batch_size: int = 8, **extra: Any) -> Iterator[TorchBackend]:
    options = BackendOptions(device="cuda:0", max_batch_size=max_batch_size, extra=extra)
    backend = create_backend("torch", zoo / name / "1" / "model.zoo", options)
    assert isinstance(backend, TorchBackend)
    backend.load()
    try:
        yield backend
    finally:
        backend.unload()


def assert_close(got: Arrays, expected: Arrays, precision: str) -> None:
    bound, floor = TOLERANCE[precision]
    for name, ref in expected.items():
        out = got[name]
        assert out.shape == ref.shape and out.dtype == ref.dtype
        error = float(np.abs(out - ref).max()) / max(float(np.abs(ref).max()), 1e-6)
        cosine = float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref)))
        assert error <= bound and cosine >= floor, f"{name}: error {error:.3g}, cos {cosine:.5f}"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
@pytest.mark.parametrize("autocast", [False, True], ids=["cast", "autocast"])
def test_precisions_match_onnxruntime(
    zoo: Path,
    references: dict[str, tuple[Arrays, Arrays]],
    name: str,
    precision: str,
    autocast: bool,
) -> None:
    if autocast and precision not in ("fp16", "bf16"):
        pytest.skip("autocast applies to fp16 and bf16")
    inputs, expected = references[name]
    for backend in loaded(zoo, name, precision=precision, autocast=autocast):
        assert_close(backend.infer(inputs), expected, precision)


def test_fp32_and_tf32_cannot_share_a_process(zoo: Path) -> None:
    for _ in loaded(zoo, "mlp", precision="fp32"):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        with pytest.raises(ConfigError, match="process-wide"):
            next(loaded(zoo, "mlp", precision="tf32"))
    for _ in loaded(zoo, "mlp", precision="tf32"):  # the claim went with the unload
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"


# Compiled with graphs only for mlp: inductor compiles once per bucket, a minute or more each
# for resnet50 and bert-base.
GRAPHED = [("mlp", False), ("resnet50", False), ("bert-base", False), ("mlp", True)]


@pytest.mark.parametrize(("name", "compiled"), GRAPHED)
def test_cuda_graphs_replay_every_bucket_with_exactly_the_rows_asked_for(
    zoo: Path, name: str, compiled: bool
) -> None:
    batch = ZOO[name].sample(8, np.random.default_rng(3))
    for plain in loaded(zoo, name, precision="fp16"):
        expected = plain.infer(batch)
    extra = {"precision": "fp16", "cuda_graphs": True, "compile": compiled}
    for backend in loaded(zoo, name, **extra):
        assert backend._graphs is not None and backend._graphs.buckets == [1, 2, 4, 8]
        for rows in (1, 3, 5, 8):
            got = backend.infer({k: v[:rows] for k, v in batch.items()})
            for key, ref in expected.items():
                assert got[key].shape == ref[:rows].shape
                np.testing.assert_allclose(got[key], ref[:rows], rtol=2e-2, atol=2e-2)


def test_channels_last_gives_the_same_outputs(
    zoo: Path, references: dict[str, tuple[Arrays, Arrays]]
) -> None:
    inputs, expected = references["resnet50"]
    for backend in loaded(zoo, "resnet50", precision="fp16", channels_last=True):
        conv = next(m for m in backend._module.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert_close(backend.infer(inputs), expected, "fp16")


def test_fp8_where_the_gpu_has_it(zoo: Path, references: dict[str, tuple[Arrays, Arrays]]) -> None:
    inputs, expected = references["bert-base"]
    if not fp8_supported(torch.cuda.get_device_capability(0)):
        with pytest.raises(ConfigError, match="compute capability"):
            next(loaded(zoo, "bert-base", precision="fp8"))
        return
    for backend in loaded(zoo, "bert-base", precision="fp8", cuda_graphs=True):
        assert_close(backend.infer(inputs), expected, "fp8")


def test_the_fast_path_is_the_default_on_cuda(zoo: Path) -> None:
    for backend in loaded(zoo, "resnet50", precision="fp16"):
        s = backend.settings
        assert s.cuda_graphs and s.channels_last and s.inflight_batches == 2
        assert backend.capabilities.concurrency == 2 and backend._graphs is not None
    for backend in loaded(zoo, "mlp", precision="fp16"):
        assert backend.settings.cuda_graphs and not backend.settings.channels_last


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_batches_in_flight_at_once_each_get_their_own_answers(zoo: Path, graphs: bool) -> None:
    """Two threads call one backend at once (as an instance with two slots does): uploads
    overlap compute, and no batch may see another's inputs or outputs."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [ZOO["resnet50"].sample(r, np.random.default_rng(r)) for r in (3, 8, 5, 1, 7, 2)]
    for backend in loaded(zoo, "resnet50", precision="fp16", cuda_graphs=graphs):
        infer = backend.infer
        alone = [infer(b)["output"] for b in batches]
        with ThreadPoolExecutor(max_workers=2) as pool:
            for _ in range(4):
                together = [out["output"] for out in pool.map(infer, batches)]
                for got, expected in zip(together, alone, strict=True):
                    # Another batch's rows would be far off; kernels may differ in the last bit.
                    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_two_instances_on_one_gpu_serve_through_the_batcher(
    zoo: Path, references: dict[str, tuple[Arrays, Arrays]], tmp_path: Path
) -> None:
    folder = tmp_path / "resnet50"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.zoo").write_bytes((zoo / "resnet50" / "1" / "model.zoo").read_bytes())
    (folder / "config.toml").write_text(
        'backend = "torch"\nmax_batch_size = 8\n'
        '[[instances]]\ncount = 2\ndevice = "cuda:0"\n'
        '[backend_options]\nprecision = "fp16"\ncuda_graphs = true\n'
    )
    inputs, expected = references["resnet50"]

    async def serve() -> list[Arrays]:
        manager = ModelManager.open(tmp_path)
        await manager.load_all()
        try:
            batcher = manager.get("resnet50").runner.batcher
            return list(await asyncio.gather(*(batcher.infer(inputs) for _ in range(16))))
        finally:
            await manager.close()

    for outputs in asyncio.run(serve()):
        assert_close(outputs, expected, "fp16")


def test_bf16_device_outputs_reach_the_host_as_bfloat16() -> None:
    # CuPy has no bfloat16: through its array interface a BF16 tensor was a void dtype, which
    # no datatype maps, so BF16 outputs to a shared-memory region failed.
    pytest.importorskip("cupy")
    import ml_dtypes

    from dlscale.serving.regions import cuda as cuda_memory

    tensor = torch.arange(6, dtype=torch.bfloat16, device="cuda:0").reshape(2, 3) / 4
    assert cuda_memory.dtype_of(tensor) == np.dtype(ml_dtypes.bfloat16)
    host = cuda_memory.to_host(tensor)
    assert host.dtype == np.dtype(ml_dtypes.bfloat16) and host.shape == (2, 3)
    np.testing.assert_array_equal(host.astype(np.float32), tensor.float().cpu().numpy())
