"""The torch variants' files, built from the zoo's MLP: each loads in the torch backend and
computes what the ONNX file computes (INT8 within quantization error), in a fresh process too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from dlscale.backends import BackendOptions, create_backend
from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.models.zoo import ZOO
from dlscale.optimize.onnx_variants import RecipeError
from dlscale.optimize.torch_build import TorchBuilder, TorchSource, torch_source
from dlscale.optimize.torch_variants import EXPORT, MODULE, PT2E_INT8

MLP = ZOO["mlp"]
ROWS = np.random.default_rng(5)


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return MLP.sample(64, ROWS)


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory, data: dict[str, np.ndarray]) -> TorchBuilder:
    return TorchBuilder(TorchSource(MLP, 128), tmp_path_factory.mktemp("torch"), data)


@pytest.fixture(scope="module")
def reference(data: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = MLP.torch_module()(torch.from_numpy(data["input"]))
    return out.numpy()  # type: ignore[no-any-return]


def _run(
    path: Path, data: dict[str, np.ndarray], max_batch_size: int = 256, **extra: object
) -> np.ndarray:
    options = BackendOptions(max_batch_size=max_batch_size, extra=extra)
    backend = create_backend("torch", path, options)
    backend.load()
    try:
        return backend.infer({"input": data["input"]})["output"]
    finally:
        backend.unload()


def test_the_exported_program_and_the_module_spec_compute_the_zoo_module(
    builder: TorchBuilder, data: dict[str, np.ndarray], reference: np.ndarray, tmp_path: Path
) -> None:
    program = builder.build(EXPORT, tmp_path / "export", None)
    spec = builder.build(MODULE, tmp_path / "module", None)
    assert program.name == "model.pt2" and spec.name == "model.zoo"
    # The FP32 program is exported once and copied for every variant that runs it.
    again = builder.build(EXPORT, tmp_path / "again", None)
    assert again.read_bytes() == program.read_bytes()
    np.testing.assert_allclose(_run(program, data), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(spec, data), reference, rtol=1e-5, atol=1e-5)
    bf16 = _run(program, data, precision="bf16")
    assert np.mean(bf16.argmax(1) == reference.argmax(1)) >= 0.9


def test_pt2e_int8_is_quantized_close_to_fp32_and_loads_in_a_fresh_process(
    builder: TorchBuilder, data: dict[str, np.ndarray], reference: np.ndarray, tmp_path: Path
) -> None:
    path = builder.build(PT2E_INT8, tmp_path / "int8", data)
    text = path.read_bytes()
    assert b"quantize_per_tensor" in text  # really quantized, not a copy of the FP32 program
    got = _run(path, data)
    assert not np.array_equal(got, reference)
    scale = float(np.abs(reference).max())
    assert float(np.abs(got - reference).max()) < 0.05 * scale
    # A server process has not imported the quantizer: the backend must register the
    # quantized ops itself before it deserializes the program.
    script = (
        "import sys, numpy as np; from pathlib import Path\n"
        "from dlscale.backends import BackendOptions, create_backend\n"
        "b = create_backend('torch', Path(sys.argv[1]), BackendOptions(max_batch_size=8))\n"
        "b.load(); print(b.infer({'input': np.ones((3, 256), np.float32)})['output'].shape)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "(3, 10)" in run.stdout


def test_int8_without_calibration_and_unknown_recipes_are_refused(
    builder: TorchBuilder, tmp_path: Path
) -> None:
    with pytest.raises(RecipeError, match="calibration"):
        builder.build(PT2E_INT8, tmp_path / "x", None)
    with pytest.raises(RecipeError, match="unknown torch recipe"):
        builder.build("torch-magic", tmp_path / "y", None)


def test_only_zoo_models_have_a_pytorch_definition(tmp_path: Path) -> None:
    from dlscale.models.zoo import build_zoo

    build_zoo(tmp_path, ["identity"])
    (tmp_path / "identity").rename(tmp_path / "mine")
    config = tmp_path / "mine" / "config.toml"
    config.write_text(config.read_text().replace('name = "identity"', 'name = "mine"'))
    repo = ModelRepository(tmp_path)
    source, why = torch_source(repo.version("mine"))
    assert source is None and "no zoo model is called 'mine'" in why
    assert "zoo = true" in why
    build_zoo(tmp_path, ["identity"])
    found, _ = torch_source(repo.version("identity"))
    assert found is not None and found.zoo is ZOO["identity"]
    with pytest.raises(DlscaleError):
        repo.version("nothing")


def test_a_package_variant_is_its_source_compiled_ahead_of_time(
    data: dict[str, np.ndarray], reference: np.ndarray, tmp_path: Path
) -> None:
    from dlscale.optimize.torch_variants import AOTI

    builder = TorchBuilder(TorchSource(MLP, 128), tmp_path / "scratch", data, max_batch_size=64)
    package = builder.build(AOTI, tmp_path / "aoti", None, {"source": EXPORT, "precision": "fp32"})
    assert package.name == "model.aoti.pt2"
    assert sorted(p.name for p in package.parent.iterdir()) == ["model.aoti.pt2"]
    got = _run(package, data, max_batch_size=64, precision="fp32")
    np.testing.assert_allclose(got, reference, atol=1e-4)
    with pytest.raises(RecipeError, match=r"AOTInductor failed.*tf32"):
        builder.build(AOTI, tmp_path / "bad", None, {"source": EXPORT, "precision": "tf32"})
