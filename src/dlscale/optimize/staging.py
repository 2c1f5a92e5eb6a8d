"""Scratch model folders: each variant staged as a repository entry the bench can load."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.models.config import BackendOptionsConfig, ModelConfig, parse_config, write_config

Arrays = dict[str, np.ndarray]
MODEL_FILE = "model.onnx"


def folder_name(variant_name: str) -> str:
    """A model-name-safe folder name for a variant (config names allow [A-Za-z0-9_.-])."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", variant_name)


def derived_config(base: ModelConfig, name: str, **changes: Any) -> ModelConfig:
    """`base` renamed, with top-level fields replaced (validated like a config file)."""
    data = base.model_dump(mode="json", exclude_none=True)
    data.pop("version_policy", None)
    data.update(name=name, **changes)
    return parse_config(data, f"<{name}>")


def backend_options_of(
    base: ModelConfig, options: Mapping[str, Any], backend: str | None = None
) -> dict[str, Any]:
    """The base config's [backend_options] with a variant's settings laid over them.

    For another backend than the base's, only the generic fields (threads) carry over: each
    runtime refuses or misreads the other's own keys.
    """
    merged = base.backend_options.model_dump(mode="json")
    if backend is not None and backend != base.backend:
        generic = BackendOptionsConfig.model_fields
        merged = {k: v for k, v in merged.items() if k in generic}
    merged.update(options)
    return merged


def copy_model(source: Path, folder: Path) -> Path:
    """A model file, or a model folder (a TensorFlow SavedModel), copied into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    return target


def stage(
    root: Path,
    name: str,
    config: ModelConfig,
    model_file: Path,
    validation: Arrays,
    *,
    link: bool = False,
) -> Path:
    """Write root/name/config.toml and root/name/1/{model file, validation.npz}.

    The model file keeps its name (model.onnx, model.pt2, model.zoo: the backend goes by it).
    With `link`, it is a symbolic link (serving settings of one file are staged many times by
    the SLO tuner); otherwise it is moved in.
    """
    folder = root / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    target = folder / "1" / model_file.name
    if link:
        os.symlink(model_file.resolve(), target)
    else:
        shutil.move(str(model_file), target)
    np.savez(str(folder / "1" / "validation.npz"), **validation)  # type: ignore[arg-type]
    write_config(config, folder / "config.toml")
    return folder
