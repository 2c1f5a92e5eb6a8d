"""Find a model's ONNX file by path, in a repository, or in the zoo (built once on first use)."""

from __future__ import annotations

from pathlib import Path

from dlscale.errors import NotFound
from dlscale.models.config import newest_file
from dlscale.models.zoo import ZOO, build_zoo

#: Where zoo models are built when no repository is named: the folder `dlscale demo` uses.
DEFAULT_ZOO_DIR = Path(".dlscale/models")


def onnx_file(model: str, repo: Path | None = None) -> Path:
    """The newest ONNX file of `model`: a .onnx path, REPO/<model>/<v>/, or the zoo's build."""
    path = Path(model)
    if path.suffix == ".onnx" and path.is_file():
        return path
    if path.name != model:  # a path, not a name to look up in a repository
        raise NotFound(f"no ONNX file at {model} (give a .onnx file or a model name)")
    root = repo if repo is not None else DEFAULT_ZOO_DIR
    found = _newest(root, model)
    if found is None and repo is None and model in ZOO:
        build_zoo(root, [model])
        found = _newest(root, model)
    if found is None:
        hint = "" if repo is not None else f"; zoo models: {sorted(ZOO)}"
        raise NotFound(f"no ONNX file for model {model!r} under {root}{hint}")
    return found


def _newest(root: Path, model: str) -> Path | None:
    folder = root / model
    return newest_file(folder, "model.onnx") if folder.is_dir() else None
