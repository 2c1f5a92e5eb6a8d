"""The chosen variant written into the repository as the model's next version."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dlscale.backends import MODEL_FILES
from dlscale.errors import DlscaleError, OptimizeError
from dlscale.models.config import parse_config, write_config
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.optimize.staging import backend_options_of, copy_model
from dlscale.optimize.variants import Variant


def staged_model_file(folder: Path, runtime: str) -> Path:
    """The model file of a variant staged at `folder` (folder/1/model.onnx, .pt2, .zoo ...)."""
    for name in MODEL_FILES.get(runtime, ()):
        if (folder / "1" / name).exists():  # a file, or a SavedModel folder
            return folder / "1" / name
    raise OptimizeError(f"{folder}/1 holds no model file for backend {runtime!r}")


def write_version(
    repo: ModelRepository, source: ModelVersion, variant: Variant, staged: Path
) -> tuple[int, Path, dict[str, Any]]:
    """Copy the staged winner in as the next version; its runtime settings go into config.toml.

    A winner on another backend than the source's (torch over ONNX Runtime) changes the
    model's backend; older versions hold no file for it, so a version policy that would still
    serve them is narrowed to the new version alone.
    """
    folder = source.path.parent
    on_disk = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    version = max(on_disk) + 1
    target = folder / str(version)
    target.mkdir()
    copy_model(staged_model_file(staged, variant.runtime), target)
    for data in ("validation.npz", "calibration.npz"):
        if (source.path / data).is_file():
            shutil.copyfile(source.path / data, target / data)
    config = source.config
    previous = config.model_dump(mode="json", exclude_none=True)
    data_: dict[str, Any] = dict(previous)
    data_["backend"] = variant.runtime
    data_["backend_options"] = backend_options_of(config, variant.backend_options, variant.runtime)
    data_["metadata"] = {
        **config.metadata,
        "optimized_variant": variant.name,
        "optimized_from_version": source.version,
    }
    policy = config.version_policy
    if variant.runtime != config.backend:
        data_.pop("platform", None)  # Triton's name for the old runtime (tensorflow_savedmodel)
        if policy.all or policy.specific is not None or (policy.latest or 1) > 1:
            data_["version_policy"] = {"specific": [version]}
    elif policy.specific is not None:
        data_["version_policy"] = {"specific": [*policy.specific, version]}
    write_config(parse_config(data_, folder / "config.toml"), folder / "config.toml")
    # The version must load as the server would load it; a broken write is undone at once.
    try:
        repo.version(source.name, version)
    except DlscaleError:
        shutil.rmtree(target)
        write_config(config, folder / "config.toml")
        raise
    return version, target, previous
