"""Which PyTorch variants a device gets, and why the others are left out."""

from __future__ import annotations

from dlscale.backends.torch.options import parse_torch_options
from dlscale.optimize.torch_variants import (
    AOTI,
    AUTOTUNE_FACTOR,
    COMPILE_CAP_S,
    EXPORT,
    MODULE,
    PT2E_INT8,
    aoti_variant,
    compile_estimate_s,
    compile_refusal,
    is_compiled,
    torch_precision_variants,
    torch_runtime_variants,
)
from dlscale.optimize.variants import DeviceCaps, ModelFacts, Variant

CNN = ModelFacts({"Conv": 4, "Relu": 4, "Gemm": 1}, image_input=True, transformer=False)
BERT = ModelFacts({"MatMul": 96, "Softmax": 12}, image_input=False, transformer=True)
CONV_ONLY = ModelFacts({"Conv": 2, "Relu": 2}, image_input=True, transformer=False)
#: This machine's CPU: AVX-512 with VNNI and BF16, no AMX.
BF16_CPU = DeviceCaps(
    "cpu", 2, frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), torch=True
)
OLD_CPU = DeviceCaps("cpu", 4, frozenset({"avx2", "fma"}), torch=True)
AMX_CPU = DeviceCaps(
    "cpu", 32, frozenset({"avx512f", "amx_int8", "amx_bf16", "amx_fp16"}), torch=True
)
PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")
H100 = DeviceCaps("cuda:0", 16, frozenset(), PROVIDERS, (9, 0), torch=True)
A100 = DeviceCaps("cuda:0", 16, frozenset(), PROVIDERS, (8, 0), torch=True)
T4 = DeviceCaps("cuda:0", 8, frozenset(), PROVIDERS, (7, 5), torch=True)


def names(variants: list[Variant]) -> list[str]:
    return [v.name for v in variants]


def reasons(skipped: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {s.name: s.reason for s in skipped}


def test_cpu_with_bf16_gets_fp32_bf16_and_pt2e_int8_and_nothing_cuda() -> None:
    tried, skipped = torch_precision_variants(CNN, BF16_CPU, has_calibration=True)
    assert names(tried) == ["torch-fp32", "torch-bf16", "torch-int8-pt2e"]
    assert all(v.runtime == "torch" for v in tried)
    int8 = tried[-1]
    assert int8.recipe == PT2E_INT8 and int8.lossy and is_compiled(int8)
    assert int8.backend_options["precision"] == "fp32"
    why = reasons(skipped)
    assert "CUDA" in why["torch-tf32"] and "8.9" in why["torch-fp8"]
    assert "AMX-FP16" in why["torch-fp16"]


def test_cpu_without_bf16_or_vnni_gets_fp32_only_and_says_why() -> None:
    tried, skipped = torch_precision_variants(CNN, OLD_CPU, has_calibration=True)
    assert names(tried) == ["torch-fp32"]
    why = reasons(skipped)
    assert "emulated" in why["torch-bf16"] and "VNNI" in why["torch-int8-pt2e"]


def test_cpu_int8_needs_calibration_and_something_to_quantize() -> None:
    _, skipped = torch_precision_variants(CNN, BF16_CPU, has_calibration=False)
    assert "calibration" in reasons(skipped)["torch-int8-pt2e"]
    identity = ModelFacts({"Identity": 1}, image_input=False, transformer=False)
    tried, skipped = torch_precision_variants(identity, BF16_CPU, has_calibration=True)
    assert "torch-int8-pt2e" not in names(tried)
    assert "quantize" in reasons(skipped)["torch-int8-pt2e"]


def test_amx_cpu_gets_fp16_too_and_transformers_cast_from_the_module() -> None:
    tried, _ = torch_precision_variants(BERT, AMX_CPU, has_calibration=True)
    assert names(tried) == ["torch-fp32", "torch-fp16", "torch-bf16", "torch-int8-pt2e"]
    recipes = {v.name: v.recipe for v in tried}
    # An exported transformer has its dtypes baked in; half casts rebuild the module.
    assert recipes["torch-fp16"] == recipes["torch-bf16"] == MODULE
    assert recipes["torch-fp32"] == EXPORT
    cnn, _ = torch_precision_variants(CNN, AMX_CPU, has_calibration=True)
    assert {v.name: v.recipe for v in cnn}["torch-bf16"] == EXPORT


def test_h100_gets_every_precision_with_8_bit_from_the_module_and_no_pt2e() -> None:
    tried, skipped = torch_precision_variants(BERT, H100, has_calibration=True)
    assert names(tried) == [
        "torch-fp32",
        "torch-tf32",
        "torch-fp16",
        "torch-bf16",
        "torch-fp8",
        "torch-int8",
    ]
    fp8, int8 = tried[-2:]
    assert fp8.recipe == MODULE and fp8.backend_options == {"precision": "fp8"}
    assert int8.recipe == MODULE and int8.backend_options == {"precision": "int8"}
    assert "x86" in reasons(skipped)["torch-int8-pt2e"]
    # A convolutional model also gets every convolution gathered into 8-bit products.
    cnn, _ = torch_precision_variants(CNN, H100, has_calibration=True)
    assert names(cnn)[-4:] == [
        "torch-fp8",
        "torch-fp8-allconv",
        "torch-int8",
        "torch-int8-allconv",
    ]
    assert cnn[-1].backend_options == {"precision": "int8", "lowp_convs": "all"}


def test_fp8_needs_capability_8_9_and_a_product_to_run() -> None:
    tried, skipped = torch_precision_variants(BERT, A100, has_calibration=True)
    assert "torch-fp8" not in names(tried) and "torch-bf16" in names(tried)
    assert "torch-int8" in names(tried)
    assert "8.9" in reasons(skipped)["torch-fp8"] and "8.0" in reasons(skipped)["torch-fp8"]
    # Convolutions count: 1x1 ones are matrix products (the backend fails the variant, with
    # its reason, when none of a model's layers can run in 8 bits).
    tried, _ = torch_precision_variants(CONV_ONLY, H100, has_calibration=True)
    assert "torch-fp8" in names(tried)
    identity = ModelFacts({"Identity": 1}, image_input=False, transformer=False)
    tried, skipped = torch_precision_variants(identity, H100, has_calibration=True)
    assert "torch-fp8" not in names(tried) and "torch-int8" not in names(tried)
    assert "neither" in reasons(skipped)["torch-fp8"]


def test_pre_ampere_gpu_gets_fp32_fp16_and_int8_only() -> None:
    tried, skipped = torch_precision_variants(CNN, T4, has_calibration=True)
    assert names(tried) == ["torch-fp32", "torch-fp16", "torch-int8", "torch-int8-allconv"]
    why = reasons(skipped)
    assert "7.5" in why["torch-tf32"] and "7.5" in why["torch-bf16"] and "7.5" in why["torch-fp8"]


def test_cpu_runtime_stage_tries_layout_and_compile_and_explains_the_rest() -> None:
    best, _ = torch_precision_variants(CNN, BF16_CPU, has_calibration=True)
    tried, skipped = torch_runtime_variants(best[1], CNN, BF16_CPU)
    assert names(tried) == [
        "torch-bf16+channels_last",
        "torch-bf16+compile",
        "torch-bf16+aoti",
    ]
    assert tried[0].backend_options == {"precision": "bf16", "channels_last": True}
    why = reasons(skipped)
    assert set(why) == {
        "torch-bf16+cuda_graphs",
        "torch-bf16+compile-reduce-overhead",
        "torch-bf16+compile-max-autotune",
    }
    # INT8 is compiled already; a transformer has no 4-D input for channels_last.
    tried, skipped = torch_runtime_variants(best[2], BERT, BF16_CPU)
    assert tried == []
    assert "4-D" in reasons(skipped)["torch-int8-pt2e+channels_last"]


def test_gpu_runtime_stage_compares_ways_of_compiling_and_packages_8_bit_variants() -> None:
    first, _ = torch_precision_variants(CNN, H100, has_calibration=True)
    fp16 = next(v for v in first if v.name == "torch-fp16")
    fp8 = next(v for v in first if v.name == "torch-fp8")
    tried, skipped = torch_runtime_variants(fp16, CNN, H100, accepted=[fp16, fp8])
    assert names(tried) == [
        "torch-fp16+compile",
        "torch-fp16+compile-max-autotune",
        "torch-fp16+compile-reduce-overhead",
        "torch-fp16+aoti",
        "torch-fp16+aoti-max-autotune",
        "torch-fp8+aoti",
    ]
    # The backend's own graphs with max-autotune; inductor's own with reduce-overhead.
    assert tried[1].backend_options["compile_mode"] == "max-autotune-no-cudagraphs"
    assert tried[2].backend_options["cuda_graphs"] is False
    assert "on by default" in next(iter(reasons(skipped).values()))


def test_a_package_variant_compiles_in_what_it_can_and_serves_with_the_rest() -> None:
    first, _ = torch_precision_variants(CNN, H100, has_calibration=True)
    fp8_all = next(v for v in first if v.name == "torch-fp8-allconv")
    package = aoti_variant(fp8_all, "aoti-max-autotune", compile_mode="max-autotune-no-cudagraphs")
    assert package.recipe == AOTI and is_compiled(package) and package.lossy
    assert package.params == {
        "source": MODULE,
        "precision": "fp8",
        "lowp_convs": "all",
        "compile_mode": "max-autotune-no-cudagraphs",
    }
    assert package.backend_options == {}
    # Compiled ahead of time with max-autotune: the budget holds it to a longer estimate.
    assert compile_estimate_s(CNN, package) == AUTOTUNE_FACTOR * compile_estimate_s(CNN)


def test_every_generated_option_set_is_one_the_torch_backend_accepts() -> None:
    for caps in (BF16_CPU, OLD_CPU, AMX_CPU, H100, A100, T4):
        for facts in (CNN, BERT):
            first, _ = torch_precision_variants(facts, caps, has_calibration=True)
            for v in first:
                second, _ = torch_runtime_variants(v, facts, caps)
                for variant in (v, *second):
                    parse_torch_options(variant.backend_options)
                    settings = {k: w for k, w in variant.params.items() if k != "source"}
                    parse_torch_options(settings)


def test_compile_estimate_grows_with_the_graph_and_is_capped() -> None:
    small = compile_estimate_s(CNN)
    assert 20 <= small < compile_estimate_s(BERT) <= COMPILE_CAP_S
    huge = ModelFacts({"MatMul": 5000}, image_input=False, transformer=True)
    assert compile_estimate_s(huge) == COMPILE_CAP_S


def test_a_compiled_variant_does_not_start_when_its_compile_would_overrun_the_budget() -> None:
    first, _ = torch_precision_variants(CNN, BF16_CPU, has_calibration=True)
    eager, int8 = first[0], first[2]
    estimate = compile_estimate_s(CNN)
    assert compile_refusal(eager, CNN, 0.5) == ""  # eager: the budget check is the search's
    assert compile_refusal(int8, CNN, estimate + 1) == ""
    why = compile_refusal(int8, CNN, estimate - 1)
    assert f"estimated at {estimate:.0f} s" in why and "time budget" in why
