"""AOTInductor packages on the CPU: the small zoo models compiled ahead of time, loaded, served.

Inductor and AOTInductor run on the CPU, so the whole path is checked here: the model is built
as the backend builds it, exported with a dynamic batch dimension, compiled into model.aoti.pt2
(mlp with FP16 inputs, digits with UINT8 pixels normalized inside),
loaded without compiling, and compared with the ONNX Runtime backend on the zoo's ONNX file;
a convolution + BatchNorm model is packaged too (folded under no_grad, which export accepts;
`make test-slow`: a third compile), and a package whose recorded torch release is forged is
refused before AOTInductor loads it. Compiling the two of the default run takes about a minute
on 2 cores; resnet50 and bert-base are packaged on a GPU only (tests/gpu).
"""

from __future__ import annotations

import asyncio
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from tests.toolkit.slow import slow_only

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.torch.aoti import load_package, read_info
from dlscale.backends.torch.files import ZOO_NETS, write_module_spec
from dlscale.backends.torch.packaging import Packaged, package_model
from dlscale.errors import ConfigError
from dlscale.models.flops import count, count_file
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.inputs import PIXELS, as_input_type, torch_entry
from dlscale.models.zoo.nets.small import make_conv_bn
from dlscale.serving.manager import ModelManager
from dlscale.types import Datatype, TensorSpec

Arrays = dict[str, np.ndarray]
MAX_BATCH = 16
#: The small models, each with another declared input type (FP32 inputs:
#: tests/unit/optimize/test_torch_build.py's package, and the BatchNorm model below in
#: `make test-slow`; each compile is 20-40 s).
CASES = {"mlp": "fp16", "digits": "uint8"}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Packaged]:
    root = tmp_path_factory.mktemp("packages")
    out = {}
    for name, input_type in CASES.items():
        source = torch_entry(ZOO[name], input_type).write(root / name / "model.zoo")
        options = BackendOptions(max_batch_size=MAX_BATCH, extra={"compile_mode": "default"})
        out[name] = package_model(source, options, root / name / "model.aoti.pt2")
    return out


@pytest.mark.slow
@slow_only("a third AOTInductor compile, 45-95 s on 2 cores")
def test_a_batchnorm_model_packages_and_matches_its_module(tmp_path: Path) -> None:
    # The build folds BatchNorm and casts weights: made under inference_mode, those tensors
    # were inference tensors, and torch.export refused every such model outside that mode.
    source = tmp_path / "convbn" / "model.zoo"
    source.parent.mkdir()
    specs = ([TensorSpec("input", Datatype.FP32, (-1, 3, 8, 8))],)
    specs += ([TensorSpec("output", Datatype.FP32, (-1, 10))],)
    write_module_spec(source, f"{ZOO_NETS}.small:make_conv_bn", {"seed": 3}, *specs)
    options = BackendOptions(max_batch_size=4, extra={"compile_mode": "default"})
    packaged = package_model(source, options, tmp_path / "convbn" / "model.aoti.pt2")
    assert packaged.info.torch_version == torch.__version__ and packaged.info.capability is None
    images = np.random.default_rng(5).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        expected = make_conv_bn(3)[0](torch.from_numpy(images)).numpy()
    backend = create_backend("torch", packaged.path, BackendOptions(max_batch_size=4))
    backend.load()
    try:
        got = backend.infer({"input": images})["output"]
    finally:
        backend.unload()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_package_of_another_torch_release_is_refused(
    packages: dict[str, Packaged], tmp_path: Path
) -> None:
    # AOTInductor only warns on a mismatch, then fails in its kernels: dlscale refuses first.
    forged = tmp_path / "model.aoti.pt2"
    with (
        zipfile.ZipFile(packages["mlp"].path) as source,
        zipfile.ZipFile(forged, "w") as out,
    ):
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("_metadata.json") and b"dlscale." in data:
                metadata = json.loads(data)
                metadata["dlscale.torch_version"] = json.dumps("2.0.0")
                data = json.dumps(metadata).encode()
            out.writestr(item, data)
    assert read_info(forged).torch_version == "2.0.0"
    with pytest.raises(ConfigError, match=r"compiled by torch 2\.0\.0, this process runs"):
        load_package(forged, torch.device("cpu"), single_threaded=True)
    backend = create_backend("torch", forged, BackendOptions(max_batch_size=MAX_BATCH))
    with pytest.raises(ConfigError, match="rebuild the package"):
        backend.load()


def _reference(small_repo: Path, name: str, inputs: Arrays) -> Arrays:
    """ONNX Runtime's outputs on the FP32 inputs the declared ones stand for."""
    fp32 = {
        k: PIXELS[name].to_images(v) if v.dtype == np.uint8 else v.astype(np.float32)
        for k, v in inputs.items()
    }
    ort = create_backend("onnxruntime", small_repo / name / "1" / "model.onnx", BackendOptions())
    ort.load()
    try:
        return ort.infer(fp32)
    finally:
        ort.unload()


@pytest.mark.parametrize("name", list(CASES))
def test_a_package_loads_without_compiling_and_matches_onnxruntime(
    packages: dict[str, Packaged], small_repo: Path, name: str
) -> None:
    from torch._dynamo.utils import counters

    model, input_type = ZOO[name], CASES[name]
    packaged = packages[name]
    assert packaged.info.device == "cpu" and packaged.info.max_batch == MAX_BATCH
    assert [s.datatype.value for s in packaged.info.inputs] == [input_type.upper()]
    frames = sum(counters["frames"].values())
    backend = create_backend("torch", packaged.path, BackendOptions(max_batch_size=MAX_BATCH))
    backend.load()
    try:
        assert sum(counters["frames"].values()) == frames  # dynamo traced nothing
        for rows in (1, 3, MAX_BATCH):  # one package, any batch size
            inputs = as_input_type(
                model, model.sample(rows, np.random.default_rng(rows)), input_type
            )
            got, expected = backend.infer(inputs), _reference(small_repo, name, inputs)
            for key, ref in expected.items():
                assert got[key].shape == ref.shape and got[key].dtype == ref.dtype
                error = float(np.abs(got[key] - ref).max()) / max(float(np.abs(ref).max()), 1e-6)
                assert error <= 5e-4, f"{name} {key} at {rows} rows: relative error {error:.2e}"
    finally:
        backend.unload()


def test_the_package_carries_its_flops(packages: dict[str, Packaged], small_repo: Path) -> None:
    for name in ("mlp", "digits"):
        onnx_macs = count(small_repo / name / "1" / "model.onnx").macs
        assert count_file(packages[name].path).flops == 2 * onnx_macs


def test_settings_the_package_holds_are_refused(packages: dict[str, Packaged]) -> None:
    path = packages["mlp"].path

    def load(max_batch_size: int = MAX_BATCH, **extra: object) -> None:
        backend = create_backend(
            "torch", path, BackendOptions(max_batch_size=max_batch_size, extra=extra)
        )
        backend.load()
        backend.unload()

    with pytest.raises(ConfigError, match="compiled already"):
        load(compile=True)
    with pytest.raises(ConfigError, match="was compiled with 'fp32'"):
        load(precision="bf16")
    with pytest.raises(ConfigError, match=f"batches of up to {MAX_BATCH}"):
        load(max_batch_size=2 * MAX_BATCH)
    with pytest.raises(ConfigError, match="compiled for cpu"):
        load_package(path, torch.device("cuda", 0), single_threaded=True)
    load(precision="fp32", static_buckets=True, batch_buckets=[4, MAX_BATCH])  # agrees: loads


async def test_a_package_in_a_version_folder_serves_through_the_batcher(
    packages: dict[str, Packaged], small_repo: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "digits"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.aoti.pt2").write_bytes(packages["digits"].path.read_bytes())
    config = {
        "backend": "torch",
        "max_batch_size": MAX_BATCH,
        "batching": {"max_queue_delay_us": 5000},
    }
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    model = ZOO["digits"]
    inputs = as_input_type(model, model.sample(6, np.random.default_rng(9)), "uint8")
    manager = ModelManager.open(tmp_path)
    await manager.load_all()
    try:
        batcher = manager.get("digits").runner.batcher
        halves = await asyncio.gather(
            batcher.infer({"input": inputs["input"][:2]}),
            batcher.infer({"input": inputs["input"][2:]}),
        )
    finally:
        await manager.close()
    got = np.concatenate([h["output"] for h in halves])
    expected = _reference(small_repo, "digits", inputs)["output"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
