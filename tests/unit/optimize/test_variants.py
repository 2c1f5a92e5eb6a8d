"""Which variants a device gets, and why the others are left out."""

from __future__ import annotations

from dlscale.optimize.variants import DeviceCaps, ModelFacts, precision_variants, runtime_variants

CNN = ModelFacts({"Conv": 4, "Relu": 4, "Gemm": 1}, image_input=True, transformer=False)
BERT = ModelFacts({"MatMul": 96, "Softmax": 12}, image_input=False, transformer=True)
VNNI_CPU = DeviceCaps("cpu", 2, frozenset({"avx2", "avx512f", "avx512_vnni"}))
GPU = DeviceCaps("cuda:0", 16, frozenset(), ("CUDAExecutionProvider", "CPUExecutionProvider"))
GPU_TRT = DeviceCaps("cuda:0", 16, frozenset(), ("TensorrtExecutionProvider", *GPU.ort_providers))


def names(variants: list) -> list[str]:  # type: ignore[type-arg]
    return [v.name for v in variants]


def test_cpu_cnn_gets_static_int8_with_three_calibrations() -> None:
    tried, skipped = precision_variants(CNN, VNNI_CPU, has_calibration=True)
    assert names(tried) == [
        "fp32",
        "int8-static-minmax",
        "int8-static-entropy",
        "int8-static-percentile",
    ]
    assert all(v.params["per_channel"] for v in tried if v.recipe == "int8-static")
    reasons = {s.name: s.reason for s in skipped}
    assert "FP16" in reasons["fp16"] and "int8-dynamic" in reasons


def test_transformer_gets_dynamic_int8_and_no_calibration_means_no_static() -> None:
    tried, skipped = precision_variants(BERT, VNNI_CPU, has_calibration=False)
    assert names(tried) == ["fp32", "int8-dynamic"]
    assert any(s.name == "int8-static-*" for s in skipped)


def test_gpu_gets_fp16_and_int8_only_through_tensorrt() -> None:
    tried, skipped = precision_variants(CNN, GPU, has_calibration=True)
    assert names(tried) == ["fp32", "fp16"]
    assert any("TensorRT" in s.reason for s in skipped)
    with_trt, _ = precision_variants(CNN, GPU_TRT, has_calibration=True)
    assert {"trt-fp32", "trt-fp16", "int8-static-minmax"} <= set(names(with_trt))


def test_runtime_stage_varies_settings_of_the_best_file() -> None:
    best, _ = precision_variants(CNN, VNNI_CPU, has_calibration=True)
    tried, skipped = runtime_variants(best[1], CNN, VNNI_CPU)
    assert names(tried) == [
        "int8-static-minmax+opt-basic",
        "int8-static-minmax+opt-extended",
        "int8-static-minmax+threads-1",
    ]
    assert all(v.recipe == "int8-static" for v in tried)
    assert any("NCHWc" in s.reason for s in skipped)
    on_gpu, _ = runtime_variants(best[0], CNN, GPU)
    assert on_gpu[-1].backend_options["prefer_nhwc"] is True
