"""Model configuration (`REPO/<model>/config.toml`): parsed, validated, and explained when wrong."""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dlscale.backends import MODEL_FILES
from dlscale.errors import ConfigError
from dlscale.types import Datatype, TensorSpec

NonNegative = Annotated[int, Field(ge=0)]
#: Triton's platform name for each backend, reported when config.toml names none.
PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "torch": "pytorch_libtorch",
    "null": "dlscale_null",
    "python": "python",
}
Positive = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    # Unknown fields are errors: a misspelt knob silently ignored is worse than a refusal.
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorConfig(_Strict):
    """A tensor in config.toml; its shape leaves out the batch dim when max_batch_size > 0."""

    name: str = Field(min_length=1)
    datatype: Datatype
    shape: list[Annotated[int, Field(ge=-1)]]
    #: Outputs only: a text file in the model's folder, one class label per line (the
    #: classification extension answers "score:index:label" with it).
    label_file: str = ""


class BatchingConfig(_Strict):
    """Dynamic batching and queue policy (Triton's dynamic_batching and default_queue_policy)."""

    max_queue_delay_us: NonNegative = 0
    preferred_batch_sizes: list[Positive] = []
    #: Number of priority levels; requests ask for 1 (highest) .. priority_levels.
    priority_levels: Positive = 1
    #: The level of requests that give no priority (or 0); defaults to the lowest.
    default_priority_level: NonNegative = 0
    #: Requests beyond this many queued are refused at once; 0 means unbounded.
    max_queue_size: NonNegative = 0
    #: Queue timeout for requests that give none; 0 means none.
    default_timeout_us: NonNegative = 0
    #: Send a batch at once when requests arrive further apart than the delay (no company is
    #: expected); false waits out max_queue_delay_us every time, as Triton does.
    adaptive_queue_delay: bool = True

    @model_validator(mode="after")
    def _levels(self) -> BatchingConfig:
        if self.default_priority_level > self.priority_levels:
            raise ValueError(
                f"default_priority_level {self.default_priority_level} is above "
                f"priority_levels {self.priority_levels}"
            )
        return self


class QosConfig(_Strict):
    """Quality of service of a model that shares its devices with others (docs/qos.md).

    Any [qos] table, even an empty one, puts the model's devices under the device scheduler.
    """

    #: The p99 of a request's time in the server (queue and compute) to hold; 0: best effort.
    latency_objective_us: NonNegative = 0
    #: Share of device time against the other models on the device when nobody is behind.
    weight: Annotated[float, Field(gt=0)] = 1.0
    #: Requests queued or computing beyond this many are refused at once (429); 0: no limit.
    max_in_flight: NonNegative = 0
    #: Requests per second admitted (a token bucket); beyond it refused at once (429); 0: none.
    rate_limit: Annotated[float, Field(ge=0)] = 0.0
    #: Requests the bucket holds: a burst admitted at once; 0: one second's worth (at least 1).
    rate_burst: NonNegative = 0


class InstanceConfig(_Strict):
    """`count` copies of the model on one device: cpu, cuda:N or a MIG UUID."""

    count: Positive = 1
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?|MIG-[0-9A-Za-z/-]+)$")


class VersionPolicy(_Strict):
    """Which versions to serve: the latest N, all, or the ones listed."""

    latest: Positive | None = None
    all: bool = False
    specific: list[Positive] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> VersionPolicy:
        kinds = sum([self.latest is not None, self.all, self.specific is not None])
        if kinds > 1:
            raise ValueError("give only one of latest, all or specific")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of those on disk, ascending."""
        ordered = sorted(available)
        if self.all:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in self.specific]
        return ordered[-(self.latest or 1) :]


class BackendOptionsConfig(_Strict):
    """Runtime settings; unknown keys go to the runtime as they are."""

    model_config = ConfigDict(extra="allow", frozen=True)

    intra_op_threads: NonNegative = 0
    inter_op_threads: NonNegative = 0
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"


class ModelConfig(_Strict):
    """Everything config.toml says about one model."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    backend: Literal["onnxruntime", "torch", "null", "python"] = "onnxruntime"
    platform: str = ""
    #: The model file's name in each version folder (default: the backend's usual names), or
    #: its path in the model's folder when there are no version folders (MLServer's layout).
    model_file: str = ""
    max_batch_size: NonNegative = 0
    inputs: list[TensorConfig] | None = None
    outputs: list[TensorConfig] | None = None
    batching: BatchingConfig = BatchingConfig()
    instances: list[InstanceConfig] = [InstanceConfig()]
    version_policy: VersionPolicy = VersionPolicy()
    backend_options: BackendOptionsConfig = BackendOptionsConfig()
    qos: QosConfig | None = None
    metadata: dict[str, str | int | float | bool] = {}

    @field_validator("model_file")
    @classmethod
    def _inside_the_folder(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{value!r} must be a path inside the model's folder")
        return value

    @model_validator(mode="after")
    def _batching_fits(self) -> ModelConfig:
        too_big = [b for b in self.batching.preferred_batch_sizes if b > self.max_batch_size]
        if too_big and self.max_batch_size > 0:
            raise ValueError(
                f"preferred_batch_sizes {too_big} exceed max_batch_size {self.max_batch_size}"
            )
        if not self.instances:
            raise ValueError("instances: give at least one {count, device}")
        labelled = [t.name for t in self.inputs or () if t.label_file]
        if labelled:
            raise ValueError(f"inputs {labelled}: label_file belongs on outputs")
        return self

    @property
    def platform_name(self) -> str:
        """The platform metadata reports: config.toml's, else Triton's name for the backend."""
        return self.platform or PLATFORMS[self.backend]

    @property
    def batched(self) -> bool:
        """Whether inputs carry a leading batch dimension that the server may merge."""
        return self.max_batch_size > 0

    def model_files(self) -> tuple[str, ...]:
        """File names a version folder may hold for this config's backend, in preference order."""
        return (self.model_file,) if self.model_file else MODEL_FILES[self.backend]

    def tensor_specs(self, which: Literal["inputs", "outputs"]) -> list[TensorSpec] | None:
        """Inputs or outputs as full specs (batch dim included as -1), or None when omitted."""
        tensors = self.inputs if which == "inputs" else self.outputs
        if tensors is None:
            return None
        prefix = (-1,) if self.batched else ()
        return [TensorSpec(t.name, t.datatype, (*prefix, *t.shape)) for t in tensors]


#: Triton's and MLServer's names for config.toml's fields, for the hint when one is used here.
PEER_NAMES: dict[str, tuple[str, str]] = {
    "max_queue_delay_microseconds": ("max_queue_delay_us", "Triton"),
    "preferred_batch_size": ("preferred_batch_sizes", "Triton"),
    "default_timeout_microseconds": ("default_timeout_us", "Triton"),
    "default_queue_policy": ("max_queue_size and default_timeout_us in [batching]", "Triton"),
    "dynamic_batching": ("[batching]", "Triton"),
    "instance_group": ("[[instances]]", "Triton"),
    "input": ("[[inputs]]", "Triton"),
    "output": ("[[outputs]]", "Triton"),
    "dims": ("shape", "Triton"),
    "data_type": ("datatype", "Triton"),
    "label_filename": ("label_file", "Triton"),
    "kind": ("device", "Triton"),
    "gpus": ("device", "Triton"),
    "parameters": ("[metadata] or [backend_options]", "Triton"),
    "max_batch_time": ("max_queue_delay_us in [batching]", "MLServer"),
}


def parse_config(data: dict[str, Any], source: Path | str) -> ModelConfig:
    """Validate a config dict; errors name the file, the field and what was expected."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        got = first.get("input")
        shown = "" if isinstance(got, dict) or first["type"] == "missing" else f" (got {got!r})"
        if first["type"] == "extra_forbidden" and first["loc"]:
            shown += _hint(str(first["loc"][-1]))
        more = f" [and {exc.error_count() - 1} more]" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: field '{where}': {first['msg']}{shown}{more}") from None


def _hint(field: str) -> str:
    """ "did you mean ...?" for a peer's name or a misspelling of a config.toml field."""
    if field in PEER_NAMES:
        ours, peer = PEER_NAMES[field]
        return f" (did you mean {ours}? '{field}' is {peer}'s name)"
    close = difflib.get_close_matches(field, _field_names(ModelConfig), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _field_names(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for kind in typing.get_args(info.annotation) or (info.annotation,):
            inner = typing.get_args(kind) or (kind,)
            for sub in inner:
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    names |= _field_names(sub)
    return names


def load_config(path: Path, expected_name: str | None = None) -> ModelConfig:
    """Read and validate a config.toml; the name defaults to (and must equal) its folder's."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (every model folder needs a config.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if expected_name is not None:
        data.setdefault("name", expected_name)
    config = parse_config(data, path)
    if expected_name is not None and config.name != expected_name:
        raise ConfigError(
            f"{path}: field 'name': expected the folder's name {expected_name!r}, "
            f"got {config.name!r}"
        )
    return config


def write_config(config: ModelConfig, path: Path) -> None:
    """Write a config back as TOML (used by the optimizer and the SLO tuner)."""
    path.write_text(tomli_w.dumps(config.model_dump(mode="json", exclude_none=True)))
