"""The zoo's GPU entries: the settings they serve with, written as a repository reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlscale.models.repository import ModelRepository
from dlscale.models.zoo.gpu import gpu_config, gpu_serving, write_gpu_entry


def test_resnet50_serves_fp16_on_uint8_pixels_from_a_package() -> None:
    serving = gpu_serving("resnet50")
    assert (serving.precision, serving.input_type, serving.max_batch_size) == ("fp16", "uint8", 256)
    config = gpu_config("resnet50", serving, "cuda:0", packaged=True, buckets=[64, 256])
    assert config["inputs"] == [{"name": "input", "datatype": "UINT8", "shape": [3, 224, 224]}]
    # A package holds precision and compile settings; only runtime ones stay in the config.
    assert config["backend_options"] == {"batch_buckets": [64, 256]}
    compiled = gpu_config("resnet50", serving, "cuda:0", packaged=False)
    assert compiled["backend_options"] == {
        "precision": "fp16",
        "compile_mode": "default",
        "compile": True,
    }
    fp8 = gpu_serving("resnet50", precision="fp8", lowp_convs="all").compiled_settings()
    assert fp8["lowp_convs"] == "all"


def test_an_unpackaged_entry_is_a_model_zoo_the_repository_serves(tmp_path: Path) -> None:
    serving = gpu_serving("bert-base", max_batch_size=64, instances=2)
    write_gpu_entry(tmp_path, "bert-base", "cuda:1", serving, package=False)
    version = ModelRepository(tmp_path).version("bert-base")
    assert version.model_file.name == "model.zoo"
    assert version.config.backend == "torch" and version.config.max_batch_size == 64
    assert [(g.count, g.device) for g in version.config.instances] == [(2, "cuda:1")]
    assert [s.datatype.value for s in version.config.inputs] == ["INT64", "INT64"]
