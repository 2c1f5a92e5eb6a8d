"""Model configuration (`REPO/<model>/config.toml`): parsed, validated, and explained when wrong."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dlscale.backends import MODEL_FILES, RUNTIMES
from dlscale.errors import ConfigError, closest
from dlscale.models.config_sections import (
    STRICT,
    BatchingConfig,
    MemoryConfig,
    NonNegative,
    Positive,
    QosConfig,
    RoutingConfig,
)
from dlscale.types import Datatype, TensorSpec


def inside_the_folder(value: str) -> str:
    """A relative path that cannot leave the model's folder (no root, no '..', no NUL)."""
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\0" in value:
        raise ValueError(f"{value!r} must be a path inside the model's folder")
    return value


#: A path config.toml gives to a file of the model's folder.
FolderPath = Annotated[str, AfterValidator(inside_the_folder)]


class _Strict(BaseModel):
    model_config = STRICT


class TensorConfig(_Strict):
    """A tensor in config.toml; its shape leaves out the batch dim when max_batch_size > 0."""

    name: str = Field(min_length=1)
    datatype: Datatype
    shape: list[Annotated[int, Field(ge=-1)]]
    #: Outputs only: a text file in the model's folder, one class label per line (the
    #: classification extension answers "score:index:label" with it).
    label_file: FolderPath = ""


class WarmupConfig(_Strict):
    """One warm-up request sent before the model is ready (Triton's model_warmup): `count`
    times a batch of `batch_size` rows; each input zeros, random values, or a file."""

    name: str = ""
    batch_size: NonNegative = 1
    count: Positive = 1
    #: Input name -> "zero", "random", or "file:NAME" (raw values of one row, in the model's
    #: warmup/ folder, as Triton's input_data_file); inputs not named are zeros.
    inputs: dict[str, str] = {}

    @field_validator("inputs")
    @classmethod
    def _kinds(cls, value: dict[str, str]) -> dict[str, str]:
        for name, kind in value.items():
            if kind not in ("zero", "random") and not kind.startswith("file:"):
                raise ValueError(
                    f"input {name!r}: expected zero, random or file:NAME, got {kind!r}"
                )
            if kind.startswith("file:"):
                inside_the_folder(kind[5:])
        return value


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


class StepConfig(_Strict):
    """One step of a pipeline: a model, the tensors its inputs read and those its outputs make."""

    model: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    #: The step model's version; 0: its newest served one (Triton's -1).
    version: NonNegative = 0
    #: Step input name -> the pipeline tensor it reads (a pipeline input or an earlier output).
    input_map: dict[str, str] = Field(min_length=1)
    #: Step output name -> the pipeline tensor it makes (a pipeline output or an inner tensor).
    output_map: dict[str, str] = Field(min_length=1)

    @property
    def version_text(self) -> str:
        """The step model's version as a request names it: "" for its newest served one."""
        return str(self.version) if self.version else ""


#: Fields a pipeline may not set: it runs no model of its own, and its steps batch.
_NOT_FOR_PIPELINES = ("backend", "model_file", "batching", "instances", "backend_options", "qos")


class ModelConfig(_Strict):
    """Everything config.toml says about one model."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    #: One of the backend table's names (dlscale.backends.RUNTIMES).
    backend: str = "onnxruntime"
    platform: str = ""
    #: The model file's name in each version folder (default: the backend's usual names), or
    #: its path in the model's folder when there are no version folders (MLServer's layout).
    model_file: FolderPath = ""
    max_batch_size: NonNegative = 0
    inputs: list[TensorConfig] | None = None
    outputs: list[TensorConfig] | None = None
    batching: BatchingConfig = BatchingConfig()
    instances: list[InstanceConfig] = [InstanceConfig()]
    version_policy: VersionPolicy = VersionPolicy()
    backend_options: BackendOptionsConfig = BackendOptionsConfig()
    qos: QosConfig | None = None
    #: How a fleet's router spreads the model's generative requests (docs/scale.md).
    routing: RoutingConfig = RoutingConfig()
    memory: MemoryConfig = MemoryConfig()
    #: Warm-up requests before the model is ready; None: one batch of one row of zeros.
    warmup: list[WarmupConfig] | None = None
    #: Answer identical requests from the server's response cache (Triton's response_cache;
    #: the server's --cache-size gives it its bytes).
    response_cache: bool = False
    metadata: dict[str, str | int | float | bool] = {}
    #: A pipeline (Triton's ensemble): the steps that compute it; None for a model of its own.
    steps: list[StepConfig] | None = None
    #: A LoRA adapter's (`backend = "lora"`) base model: a generative model of the same
    #: repository, by name (docs/generative.md, "LoRA adapters").
    base: Annotated[str, Field(pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)?$")] = ""

    @field_validator("backend")
    @classmethod
    def _a_known_backend(cls, value: str) -> str:
        if value not in RUNTIMES:
            raise ValueError(f"unknown backend {value!r}: expected one of {sorted(RUNTIMES)}")
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
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            names = [t.name for t in tensors or ()]
            if twice := sorted({n for n in names if names.count(n) > 1}):
                raise ValueError(f"{kind}: {twice} named more than once")
        labelled = [t.name for t in self.inputs or () if t.label_file]
        if labelled:
            raise ValueError(f"inputs {labelled}: label_file belongs on outputs")
        if self.steps is not None:
            self._check_pipeline(self.steps)
        if (self.backend == "lora") != bool(self.base):
            raise ValueError(
                'a LoRA adapter (backend = "lora") names its base model (base = "<model>"), '
                "and only an adapter does"
            )
        return self

    @property
    def is_adapter(self) -> bool:
        """Whether the model is a LoRA adapter served on its base model's engine."""
        return bool(self.base)

    def _check_pipeline(self, steps: list[StepConfig]) -> None:
        """A pipeline declares its tensors, sets no runtime field, and its steps form a DAG."""
        if not steps:
            raise ValueError("steps: give at least one step")
        if not self.inputs or not self.outputs:
            raise ValueError("a pipeline declares its [[inputs]] and [[outputs]]")
        runtime = [f for f in _NOT_FOR_PIPELINES if f in self.model_fields_set]
        if runtime:
            raise ValueError(
                f"a pipeline runs no model of its own: remove {runtime} (each step model has its "
                "own batching and instances)"
            )
        check_steps([t.name for t in self.inputs], [t.name for t in self.outputs], steps)

    @property
    def platform_name(self) -> str:
        """The platform metadata reports: config.toml's, else Triton's name for the backend."""
        if self.steps is not None:
            return "ensemble"
        return self.platform or RUNTIMES[self.backend].platform

    @property
    def is_pipeline(self) -> bool:
        """Whether the model is a pipeline of other models' steps (it has no model file)."""
        return self.steps is not None

    @property
    def step_models(self) -> tuple[str, ...]:
        """A pipeline's step models, each once, in step order; () for a model of its own."""
        return tuple(dict.fromkeys(s.model for s in self.steps or ()))

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


def check_steps(inputs: list[str], outputs: list[str], steps: list[StepConfig]) -> None:
    """Each tensor is made once; a step reads only tensors that exist; no step waits on itself."""
    made: dict[str, int] = {}
    for i, step in enumerate(steps, 1):
        for tensor in step.output_map.values():
            if tensor in inputs or tensor in made:
                first = "a pipeline input" if tensor in inputs else f"step {made[tensor]}"
                raise ValueError(f"steps.{i}: tensor {tensor!r} is already made by {first}")
            made[tensor] = i
    for i, step in enumerate(steps, 1):
        unknown = [t for t in step.input_map.values() if t not in made and t not in inputs]
        if unknown:
            raise ValueError(f"steps.{i} ({step.model}): no input or step makes {unknown}")
    missing = [t for t in outputs if t not in made]
    if missing:
        raise ValueError(f"no step makes the pipeline outputs {missing}")
    # Kahn's order: a step is ready once every tensor it reads exists.
    ready, waiting = set(inputs), list(enumerate(steps, 1))
    while waiting:
        runnable = [(i, s) for i, s in waiting if set(s.input_map.values()) <= ready]
        if not runnable:
            raise ValueError(f"steps {[i for i, _ in waiting]} wait on each other in a circle")
        for _, step in runnable:
            ready |= set(step.output_map.values())
        waiting = [w for w in waiting if w not in runnable]


def newest_file(folder: Path, file_name: str) -> Path | None:
    """`file_name` in the newest version folder of `folder` that has it (None: in none)."""
    versions = sorted(
        (int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True
    )
    found = (folder / str(v) / file_name for v in versions)
    return next((f for f in found if f.is_file()), None)


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
    "ensemble_scheduling": ("[[steps]]", "Triton"),
    "model_name": ("model in [[steps]]", "Triton"),
    "model_version": ("version in [[steps]]", "Triton"),
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
    close = closest(field, _field_names(ModelConfig))
    return f" (did you mean {close}?)" if close else ""


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


def config_text(path: Path) -> str:
    """A config file's text (config.toml, config.pbtxt, model-settings.json); one that is not
    UTF-8 is a ConfigError naming it, as any other mistake in the file is."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_config(path: Path, expected_name: str | None = None) -> ModelConfig:
    """Read and validate a config.toml; the name defaults to (and must equal) its folder's."""
    try:
        data = tomllib.loads(config_text(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (every model folder needs a config.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if expected_name is not None:
        data.setdefault("name", expected_name)
    config = parse_config(data, path)
    if expected_name is not None:
        check_name(path, expected_name, config.name)
    return config


def check_name(source: Path | str, expected_name: str, name: object) -> None:
    """A config names its folder's model (config.toml, config.pbtxt or model-settings.json)."""
    if name != expected_name:
        raise ConfigError(
            f"{source}: field 'name': expected the folder's name {expected_name!r}, got {name!r}"
        )


def write_config(config: ModelConfig, path: Path) -> None:
    """Write a config back as TOML (used by the optimizer and the SLO tuner)."""
    path.write_text(tomli_w.dumps(config.model_dump(mode="json", exclude_none=True)))
