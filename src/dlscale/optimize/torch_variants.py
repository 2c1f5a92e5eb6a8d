"""The PyTorch variants of a model for one device, and the ones the device cannot run (why).

Stage one picks the precision (and INT8 through PT2E on x86); stage two tries the runtime
settings of the torch backend (channels_last, torch.compile modes, CUDA graphs) on the best
accepted stage-one torch variant. Nothing here imports torch: the lists are decided from the
device's capabilities and the ONNX graph's facts alone.
"""

from __future__ import annotations

from dlscale.optimize.variants import DeviceCaps, ModelFacts, Skipped, Variant

PREFIX = "torch-"
#: The recipes that make a torch variant's file (see torch_build.py).
EXPORT, MODULE, PT2E_INT8 = "torch-export", "torch-module", "torch-pt2e-int8"
#: CPU flags with BF16 dot products (AVX-512 BF16, AMX); without them BF16 is emulated.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
#: CPU flags with FP16 dot products (AMX-FP16); without them PyTorch's CPU FP16 is emulated.
FP16_CPU_FLAGS = frozenset({"amx_fp16"})
#: TF32 and fast BF16 need Ampere (8.0); FP8 matrix products Ada or Hopper (8.9).
AMPERE, FP8_CAPABILITY = (8, 0), (8, 9)
#: Rule of thumb for inductor's compile time on 2 cores, per ONNX graph node, with a floor and
#: a cap (measured: resnet50, 122 nodes, 77-270 s; bert-base, 1092 nodes, 54-200 s; digits and
#: mlp under 30 s). Deliberately pessimistic: a compile cannot be stopped once started.
COMPILE_BASE_S, COMPILE_PER_NODE_S, COMPILE_CAP_S = 20.0, 0.5, 300.0


def compile_estimate_s(facts: ModelFacts) -> float:
    """How long torch.compile (inductor) of this model may take, to hold it against the budget."""
    nodes = sum(facts.op_counts.values())
    return min(COMPILE_CAP_S, COMPILE_BASE_S + COMPILE_PER_NODE_S * nodes)


def compile_refusal(variant: Variant, facts: ModelFacts, left_s: float) -> str:
    """Why a compiled variant may not start with `left_s` of the budget left ('' if it may).

    A compile cannot be interrupted; starting one that overruns the budget is worse than
    leaving it out and saying so.
    """
    if not is_compiled(variant):
        return ""
    estimate = compile_estimate_s(facts)
    if left_s >= estimate:
        return ""
    return (
        f"torch.compile (inductor) of this model is estimated at {estimate:.0f} s on 2 cores, "
        f"more than the {max(0.0, left_s):.0f} s left of the time budget (--time-budget gives "
        "it room)"
    )


def is_compiled(variant: Variant) -> bool:
    """Whether the variant runs through torch.compile (and so pays its compile time at load)."""
    return variant.runtime == "torch" and bool(variant.backend_options.get("compile"))


def _variant(name: str, precision: str, recipe: str, *, lossy: bool, **options: object) -> Variant:
    return Variant(
        f"{PREFIX}{name}",
        precision,
        recipe,
        {},
        {"precision": "fp32" if precision == "int8" else precision, **options},
        runtime="torch",
        lossy=lossy,
    )


def torch_precision_variants(
    facts: ModelFacts, caps: DeviceCaps, *, has_calibration: bool
) -> tuple[list[Variant], list[Skipped]]:
    """Stage one for torch: FP32 always; TF32, FP16, BF16, FP8 and INT8 where the device has them.

    Whole-model FP16/BF16 casts of a transformer are built from the module (an exported graph
    bakes in the dtypes it was traced with); FP8 swaps nn.Linear modules, so it needs the module
    too. Everything else runs from one program exported once.
    """
    half_recipe = MODULE if facts.transformer else EXPORT
    tried = [_variant("fp32", "fp32", EXPORT, lossy=False)]
    skipped: list[Skipped] = []
    if caps.is_cuda:
        capability = caps.cuda_capability
        ampere = capability is not None and capability >= AMPERE
        if ampere:
            tried.append(_variant("tf32", "tf32", EXPORT, lossy=True))
        else:
            skipped.append(Skipped(f"{PREFIX}tf32", _below("TF32", AMPERE, capability)))
        tried.append(_variant("fp16", "fp16", half_recipe, lossy=True))
        if ampere:
            tried.append(_variant("bf16", "bf16", half_recipe, lossy=True))
        else:
            skipped.append(Skipped(f"{PREFIX}bf16", _below("BF16", AMPERE, capability)))
        if capability is None or capability < FP8_CAPABILITY:
            skipped.append(Skipped(f"{PREFIX}fp8", _below("FP8", FP8_CAPABILITY, capability)))
        elif not facts.has_matmul:
            skipped.append(
                Skipped(f"{PREFIX}fp8", "FP8 runs nn.Linear layers; this model has no MatMul/Gemm")
            )
        else:
            tried.append(_variant("fp8", "fp8", MODULE, lossy=True))
        skipped.append(
            Skipped(
                f"{PREFIX}int8-pt2e",
                "PT2E with X86InductorQuantizer lowers to x86 oneDNN kernels (CPU only); INT8 "
                "on a GPU goes through TensorRT",
            )
        )
        return tried, skipped
    skipped += [
        Skipped(f"{PREFIX}tf32", "TF32 is a mode of NVIDIA tensor cores (CUDA only)"),
        Skipped(f"{PREFIX}fp8", "FP8 matrix products need a CUDA device of capability 8.9+"),
    ]
    if caps.cpu_flags & FP16_CPU_FLAGS:
        tried.append(_variant("fp16", "fp16", half_recipe, lossy=True))
    else:
        skipped.append(
            Skipped(
                f"{PREFIX}fp16", "the CPU has no FP16 dot products (AMX-FP16); FP16 is emulated"
            )
        )
    if caps.cpu_flags & BF16_CPU_FLAGS:
        tried.append(_variant("bf16", "bf16", half_recipe, lossy=True))
    else:
        skipped.append(
            Skipped(
                f"{PREFIX}bf16",
                "the CPU has no BF16 dot products (AVX-512 BF16 or AMX); BF16 would be emulated",
            )
        )
    if not caps.int8_cpu_fast:
        skipped.append(
            Skipped(f"{PREFIX}int8-pt2e", "the CPU has no INT8 dot products (VNNI or AMX)")
        )
    elif not has_calibration:
        skipped.append(Skipped(f"{PREFIX}int8-pt2e", "the model has no calibration data"))
    elif not (facts.has_conv or facts.has_matmul):
        skipped.append(
            Skipped(f"{PREFIX}int8-pt2e", "no convolution or matrix product to quantize")
        )
    else:
        # The quantized program is lowered by inductor; eager it runs its quantize and
        # dequantize steps one by one in FP32.
        tried.append(_variant("int8-pt2e", "int8", PT2E_INT8, lossy=True, compile=True))
    return tried, skipped


def _below(what: str, needed: tuple[int, int], capability: tuple[int, int] | None) -> str:
    have = f"{capability[0]}.{capability[1]}" if capability else "unknown"
    return f"{what} needs compute capability {needed[0]}.{needed[1]} or later; this GPU has {have}"


def torch_runtime_variants(
    best: Variant, facts: ModelFacts, caps: DeviceCaps
) -> tuple[list[Variant], list[Skipped]]:
    """Stage two for torch: channels_last, torch.compile modes and CUDA graphs on `best`."""
    tried: list[Variant] = []
    skipped: list[Skipped] = []
    if facts.image_input and facts.has_conv:
        tried.append(best.tuned("channels_last", channels_last=True))
    else:
        skipped.append(
            Skipped(f"{best.name}+channels_last", "channels_last is for 4-D convolutional inputs")
        )
    compiled = is_compiled(best)
    if not compiled:
        tried.append(best.tuned("compile", compile=True))
    if caps.is_cuda:
        # Inductor's own CUDA graphs (reduce-overhead) against ours per bucket, and kernels
        # autotuned per shape (max-autotune); our graphs also go with a default compile.
        if not compiled:
            tried.append(
                best.tuned("compile-reduce-overhead", compile=True, compile_mode="reduce-overhead")
            )
            tried.append(
                best.tuned("compile-max-autotune", compile=True, compile_mode="max-autotune")
            )
        tried.append(best.tuned("cuda_graphs", cuda_graphs=True))
        if not compiled:
            tried.append(best.tuned("compile+cuda_graphs", compile=True, cuda_graphs=True))
        return tried, skipped
    skipped += [
        Skipped(f"{best.name}+cuda_graphs", "CUDA graphs need a CUDA device"),
        Skipped(
            f"{best.name}+compile-reduce-overhead",
            "reduce-overhead differs from the default mode by CUDA graphs (CUDA only)",
        ),
        Skipped(
            f"{best.name}+compile-max-autotune",
            "max-autotune autotunes GPU kernels; on the CPU it multiplies the compile time",
        ),
    ]
    return tried, skipped
