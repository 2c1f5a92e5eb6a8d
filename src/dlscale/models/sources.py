"""Where a model's config comes from: config.toml, else Triton's config.pbtxt, else MLServer's
model-settings.json, else the model file alone (Triton's auto-complete)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomli_w

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, load_config, newest_file
from dlscale.models.mlserver_config import load_settings
from dlscale.models.signature import onnx_signature
from dlscale.models.triton_config import load_pbtxt

#: The config files a model folder may hold, in the order they are looked for.
CONFIG_FILES = ("config.toml", "config.pbtxt", "model-settings.json")
#: max_batch_size of a model completed from its file whose tensors all lead with a variable
#: dimension: Triton's default (`--backend-config=default-max-batch-size`, 4).
AUTO_MAX_BATCH_SIZE = 4
_ONNX = "model.onnx"


@dataclass(frozen=True)
class ModelSource:
    """A model's config, the file it was read from, and the peer's fields it does not act on."""

    config: ModelConfig
    path: Path
    ignored: tuple[str, ...] = ()

    def warning(self) -> str | None:
        """One line naming every field set in a peer's config that dlscale does not act on."""
        if not self.ignored:
            return None
        return f"{self.path}: fields dlscale does not act on: {', '.join(self.ignored)}"


def read_source(folder: Path, name: str) -> ModelSource:
    """The config of the model in `folder`, from the first config file found, else its file."""
    toml, pbtxt, settings = (folder / f for f in CONFIG_FILES)
    if toml.is_file():
        return ModelSource(load_config(toml, expected_name=name), toml)
    if pbtxt.is_file():
        config, ignored = load_pbtxt(pbtxt, name)
        return ModelSource(complete(config, folder), pbtxt, ignored)
    if settings.is_file():
        config, ignored = load_settings(settings, name)
        return ModelSource(config, settings, ignored)
    model_file = newest_onnx(folder)
    if model_file is None:
        raise ConfigError(
            f"{folder}: no {', '.join(CONFIG_FILES)}, and no {_ONNX} (in a version folder) to "
            "read the model's signature from"
        )
    return ModelSource(complete(ModelConfig(name=name), folder), model_file)


def complete(config: ModelConfig, folder: Path) -> ModelConfig:
    """Triton's auto-complete: an ONNX model that declares neither tensors nor max_batch_size
    batches up to AUTO_MAX_BATCH_SIZE when every tensor of its file leads with a variable dim."""
    if config.backend != "onnxruntime" or config.max_batch_size or config.inputs or config.outputs:
        return config
    model_file = newest_onnx(folder, config.model_file or _ONNX)
    if model_file is None:
        return config  # the repository names the missing file when it looks for versions
    inputs, outputs = onnx_signature(model_file)
    tensors = [*inputs, *outputs]
    if tensors and all(t.shape and t.shape[0] == -1 for t in tensors):
        return config.model_copy(update={"max_batch_size": AUTO_MAX_BATCH_SIZE})
    return config


def newest_onnx(folder: Path, file_name: str = _ONNX) -> Path | None:
    """The model file of the newest version folder that has one, else the folder's own."""
    flat = folder / file_name
    return newest_file(folder, file_name) or (flat if flat.is_file() else None)


def as_toml(source: ModelSource) -> str:
    """The config.toml equivalent to a model's config: the fields that differ from the
    defaults, under a comment naming where it came from and what was left aside."""
    lines = [f"# Converted from {source.path.name} by `dlscale models convert`."]
    if source.ignored:
        lines.append("# Not carried over (dlscale does not act on them):")
        lines += [f"#   {field}" for field in source.ignored]
    body = source.config.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    return "\n".join(lines) + "\n" + tomli_w.dumps(body)
