"""The PyTorch variants of a model for one device, and the ones the device cannot run (why).

Stage one picks the precision (FP8 and INT8 products on GPUs, INT8 through PT2E on x86); stage
two compiles the best accepted stage-one torch variant: torch.compile (with inductor freezing
and the backend's CUDA graphs on a GPU), max-autotune, inductor's own CUDA graphs, and the
same compiled ahead of time into an AOTInductor package (`+aoti`), which is what a winner is
best written as: a server loads it in seconds instead of compiling on every start. Nothing here
imports torch: the lists are decided from the device's capabilities and the ONNX graph's facts.
"""

from __future__ import annotations

from dlscale.backends.half_precision import HALF_DOT_FLAGS
from dlscale.optimize.variants import DeviceCaps, ModelFacts, Skipped, Variant

PREFIX = "torch-"
#: The recipes that make a torch variant's file (see torch_build.py).
EXPORT, MODULE, PT2E_INT8 = "torch-export", "torch-module", "torch-pt2e-int8"
AOTI = "torch-aoti"
#: TF32 and fast BF16 need Ampere (8.0); FP8 matrix products Ada or Hopper (8.9); INT8
#: tensor-core products (torch._int_mm) Turing (7.5).
AMPERE, FP8_CAPABILITY, INT8_CAPABILITY = (8, 0), (8, 9), (7, 5)
#: Rule of thumb for inductor's compile time on 2 cores, per ONNX graph node, with a floor and
#: a cap (measured: resnet50, 122 nodes, 77-270 s; bert-base, 1092 nodes, 54-200 s; digits and
#: mlp under 30 s). Deliberately pessimistic: a compile cannot be stopped once started.
COMPILE_BASE_S, COMPILE_PER_NODE_S, COMPILE_CAP_S = 20.0, 0.5, 300.0
#: max-autotune benchmarks kernel choices per shape: several times the default compile (on an
#: H100, resnet50's torch.compile took 18 s by default and did not finish max-autotune in 270 s,
#: shared/reference/gpu-measured.md).
AUTOTUNE_FACTOR = 4.0
#: The settings an AOTInductor package compiles in (the rest stay runtime settings).
AOTI_COMPILED = ("precision", "autocast", "channels_last", "compile_mode", "freezing", "lowp_convs")


def compile_estimate_s(facts: ModelFacts, variant: Variant | None = None) -> float:
    """How long compiling this model (inductor, or AOTInductor) may take, against the budget."""
    nodes = sum(facts.op_counts.values())
    estimate = min(COMPILE_CAP_S, COMPILE_BASE_S + COMPILE_PER_NODE_S * nodes)
    settings = {**variant.backend_options, **variant.params} if variant is not None else {}
    if "max-autotune" in str(settings.get("compile_mode")):
        estimate *= AUTOTUNE_FACTOR
    return estimate


def compile_refusal(variant: Variant, facts: ModelFacts, left_s: float) -> str:
    """Why a compiled variant may not start with `left_s` of the budget left ('' if it may).

    A compile cannot be interrupted; starting one that overruns the budget is worse than
    leaving it out and saying so.
    """
    if not is_compiled(variant):
        return ""
    estimate = compile_estimate_s(facts, variant)
    if left_s >= estimate:
        return ""
    return (
        f"compiling this model (inductor) is estimated at {estimate:.0f} s on 2 cores, "
        f"more than the {max(0.0, left_s):.0f} s left of the time budget (--time-budget gives "
        "it room)"
    )


def is_compiled(variant: Variant) -> bool:
    """Whether the variant compiles (torch.compile at load, or AOTInductor when built)."""
    if variant.runtime != "torch":
        return False
    return variant.recipe == AOTI or bool(variant.backend_options.get("compile"))


def aoti_variant(base: Variant, suffix: str = "aoti", **compile_settings: object) -> Variant:
    """`base` compiled ahead of time into a package: its compile settings go into the build.

    The build reads `params` (the source recipe and what the package compiles in); the config
    keeps only runtime settings (CUDA graphs, buckets), as a package refuses the others.
    """
    settings = {**base.backend_options, **compile_settings}
    compiled = {k: v for k, v in settings.items() if k in AOTI_COMPILED}
    runtime = {k: v for k, v in settings.items() if k not in AOTI_COMPILED and k != "compile"}
    return Variant(
        f"{base.name}+{suffix}",
        base.precision,
        AOTI,
        {"source": base.recipe, **compiled},
        runtime,
        runtime="torch",
        lossy=base.lossy,
    )


def _variant(name: str, precision: str, recipe: str, *, lossy: bool, **options: object) -> Variant:
    # A PT2E INT8 program holds its quantization: the backend runs it at "fp32".
    backend_precision = "fp32" if recipe == PT2E_INT8 else precision
    return Variant(
        f"{PREFIX}{name}",
        precision,
        recipe,
        {},
        {"precision": backend_precision, **options},
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
        lowp, why_not = _lowp_variants(facts, capability)
        tried += lowp
        skipped += why_not
        skipped.append(
            Skipped(
                f"{PREFIX}int8-pt2e",
                "PT2E with X86InductorQuantizer lowers to x86 oneDNN kernels (CPU only); on a "
                "GPU INT8 runs as torch._int_mm products (torch-int8)",
            )
        )
        return tried, skipped
    skipped += [
        Skipped(f"{PREFIX}tf32", "TF32 is a mode of NVIDIA tensor cores (CUDA only)"),
        Skipped(f"{PREFIX}fp8", "FP8 matrix products need a CUDA device of capability 8.9+"),
        Skipped(
            f"{PREFIX}int8",
            "torch._int_mm products are for GPUs; on the CPU INT8 goes through PT2E",
        ),
    ]
    for half, products in (
        ("fp16", "FP16 dot products (AMX-FP16); FP16 is emulated"),
        ("bf16", "BF16 dot products (AVX-512 BF16 or AMX); BF16 would be emulated"),
    ):
        if caps.cpu_flags & HALF_DOT_FLAGS[half]:
            tried.append(_variant(half, half, half_recipe, lossy=True))
        else:
            skipped.append(Skipped(f"{PREFIX}{half}", f"the CPU has no {products}"))
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


def _lowp_variants(
    facts: ModelFacts, capability: tuple[int, int] | None
) -> tuple[list[Variant], list[Skipped]]:
    """FP8 and INT8 products on a GPU: Linear and 1x1 convolutions, then every convolution.

    Both are built from the module (they swap nn.Linear and nn.Conv2d layers). The `-allconv`
    forms also gather k x k convolutions into products ("im2col"), which pays only where the
    product, not the memory traffic, dominates; the measurement decides.
    """
    tried: list[Variant] = []
    skipped: list[Skipped] = []
    if not (facts.has_matmul or facts.has_conv):
        reason = "8-bit products run nn.Linear and convolutions; this model has neither"
        return [], [Skipped(f"{PREFIX}fp8", reason), Skipped(f"{PREFIX}int8", reason)]
    for kind, needed in (("fp8", FP8_CAPABILITY), ("int8", INT8_CAPABILITY)):
        if capability is None or capability < needed:
            skipped.append(Skipped(f"{PREFIX}{kind}", _below(kind.upper(), needed, capability)))
            continue
        tried.append(_variant(kind, kind, MODULE, lossy=True))
        if facts.has_conv:
            tried.append(_variant(f"{kind}-allconv", kind, MODULE, lossy=True, lowp_convs="all"))
    return tried, skipped


def _below(what: str, needed: tuple[int, int], capability: tuple[int, int] | None) -> str:
    have = f"{capability[0]}.{capability[1]}" if capability else "unknown"
    return f"{what} needs compute capability {needed[0]}.{needed[1]} or later; this GPU has {have}"


def torch_runtime_variants(
    best: Variant,
    facts: ModelFacts,
    caps: DeviceCaps,
    accepted: list[Variant] | None = None,
) -> tuple[list[Variant], list[Skipped]]:
    """Stage two for torch: layout and compilation of `best`, and packages of 8-bit variants.

    On a GPU channels_last (convolutional models), the backend's CUDA graphs per bucket and
    inductor freezing are on by default, so the variants compare ways of compiling: inductor
    default and max-autotune under the backend's graphs, inductor's own graphs
    (reduce-overhead), and the first two ahead of time (`+aoti`). 8-bit variants pay only
    compiled (their scaling fuses into neighbouring kernels), so every accepted one in
    `accepted` gets its `+aoti` too.
    """
    if not caps.is_cuda:
        return _cpu_runtime_variants(best, facts)
    if is_compiled(best):
        return [], [Skipped(f"{best.name}+*", "compiled already")]
    tried = [
        best.tuned("compile", compile=True),
        best.tuned("compile-max-autotune", compile=True, compile_mode="max-autotune-no-cudagraphs"),
        best.tuned(
            "compile-reduce-overhead",
            compile=True,
            compile_mode="reduce-overhead",
            cuda_graphs=False,
        ),
        aoti_variant(best),
        aoti_variant(best, "aoti-max-autotune", compile_mode="max-autotune-no-cudagraphs"),
    ]
    for other in accepted or []:
        if (
            other.name != best.name
            and other.precision in ("fp8", "int8")
            and not is_compiled(other)
        ):
            tried.append(aoti_variant(other))
    skipped = [
        Skipped(
            f"{best.name}+channels_last/cuda_graphs",
            "on by default on a GPU (channels_last for convolutional models, CUDA graphs per "
            "batch bucket)",
        )
    ]
    return tried, skipped


def _cpu_runtime_variants(best: Variant, facts: ModelFacts) -> tuple[list[Variant], list[Skipped]]:
    tried: list[Variant] = []
    skipped: list[Skipped] = []
    if facts.image_input and facts.has_conv:
        tried.append(best.tuned("channels_last", channels_last=True))
    else:
        skipped.append(
            Skipped(f"{best.name}+channels_last", "channels_last is for 4-D convolutional inputs")
        )
    if not is_compiled(best):
        tried += [best.tuned("compile", compile=True), aoti_variant(best)]
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
