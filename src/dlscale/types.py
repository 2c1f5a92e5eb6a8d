"""The vocabulary of the whole package: datatypes, tensor specs, requests, responses, answers."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from dlscale.errors import InvalidInput
from dlscale.sampling import Sampling

#: A model or request parameter as the Open Inference Protocol carries it (bool, int64 or string).
Parameter = bool | int | float | str
Parameters = dict[str, Parameter]


class Datatype(enum.StrEnum):
    """Open Inference Protocol tensor datatypes."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    BF16 = "BF16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"

    @property
    def numpy(self) -> np.dtype[Any]:
        """The numpy dtype that holds this datatype (BYTES: object arrays of ``bytes``)."""
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire; 0 for BYTES, whose elements vary in length."""
        return _TO_NUMPY[self].itemsize if self in _FROM_NUMPY_VALUES else 0

    @property
    def json_safe(self) -> bool:
        """Whether the datatype may travel as JSON numbers (FP16 and BF16 may not)."""
        return self not in _NOT_JSON

    @property
    def config_type(self) -> str:
        """Triton's model-configuration name: TYPE_FP32 and so on; BYTES is TYPE_STRING."""
        return "TYPE_STRING" if self is Datatype.BYTES else f"TYPE_{self.value}"

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any] | type) -> Datatype:
        """The datatype of a numpy dtype; raises ValueError for dtypes the protocol lacks."""
        found = _FROM_NUMPY.get(dtype)  # type: ignore[arg-type]  # a dtype: one lookup
        if found is not None:
            return found
        dt = np.dtype(dtype)
        if dt.kind in ("O", "S", "U"):
            return cls.BYTES
        try:
            return _FROM_NUMPY[dt]
        except KeyError:
            raise ValueError(f"numpy dtype {dt} has no Open Inference Protocol datatype") from None


_TO_NUMPY: dict[Datatype, np.dtype[Any]] = {
    Datatype.BOOL: np.dtype(np.bool_),
    Datatype.UINT8: np.dtype(np.uint8),
    Datatype.UINT16: np.dtype(np.uint16),
    Datatype.UINT32: np.dtype(np.uint32),
    Datatype.UINT64: np.dtype(np.uint64),
    Datatype.INT8: np.dtype(np.int8),
    Datatype.INT16: np.dtype(np.int16),
    Datatype.INT32: np.dtype(np.int32),
    Datatype.INT64: np.dtype(np.int64),
    Datatype.FP16: np.dtype(np.float16),
    Datatype.BF16: np.dtype(ml_dtypes.bfloat16),
    Datatype.FP32: np.dtype(np.float32),
    Datatype.FP64: np.dtype(np.float64),
    Datatype.BYTES: np.dtype(object),
}
_FROM_NUMPY: dict[np.dtype[Any], Datatype] = {
    v: k for k, v in _TO_NUMPY.items() if k is not Datatype.BYTES
}
# Sets of members, made once: the properties above run per tensor, and on Python 3.11 reading a
# member through its enum class (`Datatype.BYTES`) is a Python-level `__getattr__` call.
_FROM_NUMPY_VALUES = frozenset(_FROM_NUMPY.values())
_NOT_JSON = frozenset((Datatype.FP16, Datatype.BF16))


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor with a datatype and a shape; -1 marks a variable dimension."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]

    def matches(self, shape: Sequence[int]) -> bool:
        """Whether a concrete shape fits this spec (same rank, fixed dims equal)."""
        return len(shape) == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, shape, strict=True)
        )

    def with_batch(self) -> TensorSpec:
        """This spec with a leading variable batch dimension added."""
        return TensorSpec(self.name, self.datatype, (-1, *self.shape))

    def described(self) -> str:
        """Its datatype and shape as messages show them: ``FP32 [-1, 3]``."""
        return f"{self.datatype.value} {list(self.shape)}"

    def to_dict(self) -> dict[str, Any]:
        """The protocol's JSON form: ``{name, datatype, shape}``."""
        return {"name": self.name, "datatype": self.datatype.value, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        """The spec `to_dict` wrote; KeyError, TypeError or ValueError when it is not one."""
        return cls(str(data["name"]), Datatype(data["datatype"]), tuple(map(int, data["shape"])))


@dataclass(frozen=True, slots=True)
class RegionRef:
    """Where a tensor's bytes lie in a registered shared-memory region (Triton's parameters
    `shared_memory_region`, `shared_memory_byte_size` and `shared_memory_offset`)."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class RegionTensor:
    """A tensor whose data lies in a shared-memory region instead of the message."""

    datatype: Datatype
    shape: tuple[int, ...]
    ref: RegionRef


@dataclass
class RequestedOutput:
    """An output the client asked for, how it wants it sent, and the region to write it into."""

    name: str
    binary: bool | None = None
    parameters: Parameters = field(default_factory=dict)
    region: RegionRef | None = None


@dataclass
class InferenceRequest:
    """One inference request, protocol-agnostic: inputs are numpy arrays keyed by name."""

    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    #: Inputs whose data lies in shared-memory regions; the DataPlane maps them into `inputs`.
    in_regions: dict[str, RegionTensor] = field(default_factory=dict)
    #: The caller's W3C trace context (REST header / gRPC metadata `traceparent`), continued
    #: by an OTLP trace of this request ("" when none was sent).
    traceparent: str = ""
    #: A generative request's settings, typed by the frontend that read them (OpenAI's); None
    #: when they are in `parameters` (the Open Inference Protocol's), read once by the core.
    sampling: Sampling | None = None

    @property
    def priority(self) -> int:
        """Request priority: 1 is highest, 0 means the model's default level."""
        return int(self.parameters.get("priority", 0))

    @property
    def timeout_us(self) -> int:
        """Queue timeout in microseconds; 0 means the model's default."""
        return int(self.parameters.get("timeout", 0))


@dataclass
class InferenceResponse:
    """One inference response: outputs are numpy arrays keyed by name."""

    model_name: str
    outputs: dict[str, np.ndarray]
    model_version: str = ""
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    #: Outputs written into shared-memory regions (the answer carries no data for them).
    in_regions: dict[str, RegionTensor] = field(default_factory=dict)
    #: Whether this is the request's last response: a stream's responses (Plane.stream) are
    #: False but its last, which may carry no outputs (a final flag alone); a unary answer True.
    final: bool = True


# -- what the server answers about itself and its models ------------------------------------------


@dataclass(frozen=True)
class ServerMetadata:
    """The server's name, version and the protocol extensions it implements."""

    name: str
    version: str
    extensions: tuple[str, ...]


class ModelKind(enum.StrEnum):
    """How a model answers a request: the one place its kind is decided is its runner."""

    #: One answer of tensors, computed in batches.
    TENSORS = "tensors"
    #: One answer of tensors, computed by a pipeline of other models.
    PIPELINE = "pipeline"
    #: 0..N answers per request (Triton's decoupled models).
    STREAMS = "streams"
    #: A stream by the generative contract (text in, text out): the OpenAI routes serve it, and a
    #: unary request gets the stream joined.
    GENERATIVE = "generative"

    @property
    def streams(self) -> bool:
        """Whether a request gets its answers as a stream."""
        # Members are singletons: two identity tests, not a tuple of string comparisons (it is
        # asked once per request).
        return self is ModelKind.STREAMS or self is ModelKind.GENERATIVE


@dataclass(frozen=True)
class ModelMetadata:
    """A model's versions, platform and signature (shapes include the batch dim as -1)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: How it answers, decided once when it loads (dlscale's; the protocol's metadata omits it).
    kind: ModelKind = ModelKind.TENSORS


class InstanceKind(enum.StrEnum):
    """Where an instance group runs, in Triton's names."""

    CPU = "KIND_CPU"
    GPU = "KIND_GPU"


@dataclass(frozen=True)
class InstanceGroup:
    """`count` copies of a model of one kind; `gpus` lists device indices when known."""

    name: str
    count: int
    kind: InstanceKind
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class DynamicBatching:
    """The batching and queue policy of a model that batches (Triton's dynamic_batching)."""

    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    priority_levels: int
    default_priority_level: int
    max_queue_size: int
    default_timeout_us: int


@dataclass(frozen=True)
class EnsembleStep:
    """One step of a pipeline as Triton's ensemble_scheduling shows it (-1: the newest version)."""

    model_name: str
    model_version: int
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions are served: the latest N, all (`all_versions`), or those listed."""

    latest: int | None = None
    all_versions: bool = False
    specific: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ModelConfigView:
    """A model's config as the protocol shows it; tensor dims leave out the batch dim."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    version_policy: VersionPolicy
    #: None when the model does not batch (max_batch_size 0).
    dynamic_batching: DynamicBatching | None
    instance_groups: tuple[InstanceGroup, ...]
    parameters: Mapping[str, str] = field(default_factory=dict)
    #: Output name -> its label file (Triton's label_filename), for outputs that have one.
    label_files: Mapping[str, str] = field(default_factory=dict)
    #: The model file's name in each version folder (Triton's default_model_filename).
    default_model_filename: str = ""
    #: Whether the model may answer a request with 0..N responses (Triton's decoupled).
    decoupled: bool = False
    #: Whether identical requests are answered from the response cache.
    response_cache: bool = False
    #: A pipeline's steps (Triton's ensemble_scheduling); empty for any other model.
    ensemble_steps: tuple[EnsembleStep, ...] = ()


@dataclass(frozen=True)
class StatDuration:
    """A count and a total time in nanoseconds, as Triton's statistics report them."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class InferStats:
    """Where a model version's requests went and how long each step took."""

    success: StatDuration
    fail: StatDuration
    queue: StatDuration
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration
    #: Answers the response cache gave, and lookups it missed (zero where no cache is enabled).
    cache_hit: StatDuration = StatDuration()
    cache_miss: StatDuration = StatDuration()


@dataclass(frozen=True)
class BatchStats:
    """Batches of one size: how many ran (each duration's count) and where their time went."""

    batch_size: int
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


@dataclass(frozen=True)
class ModelStatistics:
    """Everything counted for one model version since it was loaded (Triton's statistics)."""

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    inference_stats: InferStats
    batch_stats: tuple[BatchStats, ...]


@dataclass(frozen=True)
class RepositoryEntry:
    """One row of the repository index; `version` is empty for a model with none served."""

    name: str
    state: str
    reason: str
    version: str = ""
    #: Bytes a loaded version holds, by device key (cpu, gpu0, ...), measured at its load.
    memory: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Traffic:
    """Bytes a model moves: its weights once per batch, activations and I/O once per sample."""

    weight_bytes: float
    sample_bytes: float

    def per_sample(self, batch: int) -> float:
        """Bytes per sample at `batch`: the sample's own, and its share of the weights."""
        if batch < 1:
            raise InvalidInput(f"batch must be at least 1, got {batch}")
        return self.weight_bytes / batch + self.sample_bytes


#: A config's device: cpu, cuda (cuda:0), cuda:N, or a MIG instance's UUID (MIG-...).
_CUDA_DEVICE = re.compile(r"^cuda(?::(\d+))?$")
DEVICE_EXPECTED = "expected cpu, cuda, cuda:N or a MIG-<uuid>"


def cuda_index(device: str) -> int | None:
    """N of a cuda:N device (cuda is 0); None for cpu and a MIG instance."""
    match = _CUDA_DEVICE.match(device)
    return int(match.group(1) or 0) if match else None


def is_mig(device: str) -> bool:
    """A MIG instance named by its UUID: its process sees it alone, as cuda:0."""
    return device.startswith("MIG-")
