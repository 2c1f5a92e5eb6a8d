"""`dlscale optimize` on a TensorFlow SavedModel: TensorFlow (with and without XLA) against ONNX
Runtime on its tf2onnx conversion, judged on the same held-out inputs, the winner written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.toolkit.slow import slow_only

from dlscale.models.repository import ModelRepository
from dlscale.optimize import OptimizeResult, OptimizeSettings, optimize
from dlscale.optimize.measure import MeterSettings

pytestmark = [
    pytest.mark.slow,
    slow_only("a tf2onnx conversion and a dozen short LoadGen runs: about 2 min on 2 cores"),
]

SHORT_METER = MeterSettings(seconds=0.5, min_queries=16, warmup_s=0.2, singlestream=False)


@pytest.fixture(scope="module")
def tf_models() -> Any:
    return pytest.importorskip("tests.toolkit.tf_models", reason="needs the [tensorflow] extra")


@pytest.fixture(scope="module")
def searched(tf_models: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    root = tmp_path_factory.mktemp("tf-optimize")
    (root / "tf-mlp" / "1").mkdir(parents=True)
    (root / "tf-mlp" / "config.pbtxt").write_text(
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 32\n'
    )
    model = tf_models.write_dense_savedmodel(root / "tf-mlp" / "1" / "model.savedmodel")
    settings = OptimizeSettings(
        device="cpu", tolerance=0.01, runtime_stage=False, meter=SHORT_METER, time_budget_s=600
    )
    return root, model, optimize(root, "tf-mlp", settings)


def test_tensorflow_and_its_onnx_conversion_are_judged_alike(
    searched: tuple[Path, Any, OptimizeResult],
) -> None:
    result = searched[2]
    trials = {t.variant.name: t for t in result.trials}
    assert {"tf-fp32", "tf-xla", "onnx-fp32"} <= set(trials), list(trials)
    for name in ("tf-fp32", "tf-xla", "onnx-fp32"):  # FP32 all: the same answers within 1%
        assert trials[name].accepted, (name, trials[name].reason)
        assert trials[name].speed is not None
    assert {trials[n].variant.runtime for n in trials} == {"tensorflow", "onnxruntime"}
    assert result.files and all(Path(f).is_file() for f in result.files.values())


def test_the_winner_is_written_and_serves_the_models_answers(
    tf_models: Any, searched: tuple[Path, Any, OptimizeResult]
) -> None:
    root, model, result = searched
    if result.written_version is None:
        assert result.winner.variant.name == "tf-fp32"
        return
    version = ModelRepository(root).version("tf-mlp", result.written_version)
    assert version.config.backend == result.winner.variant.runtime
    assert version.config.platform_name != "tensorflow_savedmodel" or (
        version.config.backend == "tensorflow"
    )
    from dlscale.backends import BackendOptions, create_backend

    backend = create_backend(version.config.backend, version.model_file, BackendOptions())
    backend.load()
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    got = next(iter(backend.infer({"x": x}).values()))
    np.testing.assert_allclose(got, tf_models.reference(model, x), rtol=0.05, atol=0.05)
