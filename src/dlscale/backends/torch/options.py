"""The torch backend's settings, read from a model config's [backend_options] and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, get_args

from dlscale.errors import ConfigError

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
#: Which convolutions FP8 and INT8 run as low-precision matrix products (docs/backends.md).
LowpConvs = Literal["none", "pointwise", "all"]

#: torch.compile modes that capture CUDA graphs themselves (inductor's cudagraph trees).
SELF_CAPTURING_MODES = ("reduce-overhead", "max-autotune")
#: Batches one CUDA instance holds at once: one computes while the next one's inputs upload.
CUDA_INFLIGHT = 2


@dataclass(frozen=True)
class TorchOptions:
    """How the torch backend runs a model: precision, layout, compilation, graphs, buckets.

    Settings left at None are chosen at load for the device (`resolve`): on CUDA the fast path
    (CUDA graphs per bucket, channels_last for convolutional models, inductor freezing, two
    batches in flight); on the CPU what the CPU runs best and tests cover.
    """

    precision: Precision = "fp32"
    #: fp16/bf16 through torch.autocast, weights kept in FP32, instead of a whole-model cast.
    autocast: bool = False
    channels_last: bool | None = None
    compile: bool = False
    compile_mode: CompileMode = "default"
    #: torch.compile backend; "aot_eager" traces like inductor without generating kernels.
    compile_backend: str = "inductor"
    #: Inductor freezing: weights become constants, so conv/BN folding and constant folding run.
    freezing: bool | None = None
    cuda_graphs: bool | None = None
    #: Batch sizes compiled or captured for; None: powers of two up to max_batch_size.
    batch_buckets: tuple[int, ...] | None = None
    #: Pad every batch to a bucket even without CUDA graphs (compiled once per bucket).
    static_buckets: bool = False
    #: Runs per bucket before a CUDA graph is captured (lazy initialization, autotuning).
    warmup_runs: int = 2
    #: Batches one instance takes at once (CUDA: the next uploads while one computes).
    inflight_batches: int | None = None
    #: FP8 / INT8: which convolutions run as low-precision matrix products.
    lowp_convs: LowpConvs = "pointwise"

    @property
    def bucketed(self) -> bool:
        """Whether batches are padded to fixed bucket sizes."""
        return bool(self.cuda_graphs) or self.static_buckets


_BOOLS = ("autocast", "channels_last", "compile", "cuda_graphs", "static_buckets", "freezing")
_POSITIVE_INTS = ("warmup_runs", "inflight_batches")


def parse_torch_options(extra: Mapping[str, Any]) -> TorchOptions:
    """TorchOptions from [backend_options]; an unknown key or a bad value is a ConfigError."""
    known = {f for f in TorchOptions.__dataclass_fields__}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ConfigError(
            f"backend_options: {unknown} are not torch backend options (known: {sorted(known)})"
        )
    options = TorchOptions(**{key: _checked(key, value) for key, value in extra.items()})
    if options.cuda_graphs and options.compile and options.compile_mode in SELF_CAPTURING_MODES:
        raise ConfigError(
            f"backend_options: compile_mode {options.compile_mode!r} captures CUDA graphs itself; "
            "set cuda_graphs = false, or use compile_mode 'default' or "
            "'max-autotune-no-cudagraphs' with cuda_graphs = true"
        )
    if options.autocast and options.precision not in ("fp16", "bf16"):
        raise ConfigError(
            f"backend_options.autocast: needs precision 'fp16' or 'bf16', got {options.precision!r}"
        )
    return options


def resolve(
    options: TorchOptions, *, on_cuda: bool, can_bucket: bool, convolutional: bool
) -> TorchOptions:
    """`options` with every setting left at None chosen for the device and the model.

    `can_bucket`: the model batches and has fixed non-batch dimensions, so CUDA graphs can be
    captured per batch bucket. `convolutional`: it has 2-D convolutions over a 4-D input.
    """
    self_capturing = options.compile and options.compile_mode in SELF_CAPTURING_MODES
    graphs = options.cuda_graphs
    if graphs is None:
        graphs = on_cuda and can_bucket and not self_capturing
    channels_last = options.channels_last
    if channels_last is None:
        channels_last = on_cuda and convolutional
    freezing = options.freezing
    if freezing is None:
        # On the CPU freezing swaps in oneDNN's prepacked kernels, which PT2E INT8 programs
        # cannot take on this torch; CUDA has no such limit (docs/optimize.md).
        freezing = on_cuda and options.compile_backend == "inductor"
    # Inductor's own CUDA graphs (cudagraph trees) are kept per thread: one batch at a time.
    inflight = options.inflight_batches or (CUDA_INFLIGHT if on_cuda and not self_capturing else 1)
    return replace(
        options,
        cuda_graphs=graphs,
        channels_last=channels_last,
        freezing=freezing,
        inflight_batches=inflight,
    )


def _checked(key: str, value: Any) -> Any:
    where = f"backend_options.{key}"
    if key == "precision":
        return _choice(where, value, get_args(Precision))
    if key == "compile_mode":
        return _choice(where, value, get_args(CompileMode))
    if key == "lowp_convs":
        return _choice(where, value, get_args(LowpConvs))
    if key == "compile_backend":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a torch.compile backend name, got {value!r}")
        return value
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if key in _POSITIVE_INTS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: expected an integer of at least 1, got {value!r}")
        return value
    # batch_buckets, the only key left
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise ConfigError(f"{where}: expected a list of positive batch sizes, got {value!r}")
    return tuple(sorted(set(value)))


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ConfigError(f"{where}: expected one of {list(allowed)}, got {value!r}")
    return cast(str, value)
