"""The model repository on disk: REPO/<model>/<config file> and REPO/<model>/<version>/<file>.

The config file is config.toml, Triton's config.pbtxt or MLServer's model-settings.json, or none
when the model file says enough (models/sources.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dlscale.backends.base import model_folder
from dlscale.errors import ConfigError, DlscaleError, NotFound
from dlscale.models.config import ModelConfig
from dlscale.models.remembered import Configs, Listing
from dlscale.models.sources import ModelSource, read_source

log = logging.getLogger("dlscale.models")


@dataclass(frozen=True)
class ModelVersion:
    """One servable version of a model: its folder, its model file, its config and the file
    the config came from (errors name it)."""

    name: str
    version: int
    path: Path
    model_file: Path
    config: ModelConfig
    source: Path

    @property
    def folder(self) -> Path:
        """The model's folder (where label files live): the version folder's parent, or the
        folder itself in MLServer's layout."""
        return model_folder(self.path)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of checking one model folder: versions found, or the error that stops it."""

    name: str
    versions: tuple[int, ...]
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


class ModelRepository:
    """Reads models from a folder; one broken model never hides the others.

    Each model's config is parsed and validated once per content of its file, and the folder
    is listed again only when it changed (models/remembered.py): loads on demand ask for both
    at every request for a cold model."""

    def __init__(self, root: Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ConfigError(f"model repository {root} is not a folder")
        self.root = root
        self.configs = Configs()
        self._listing = Listing(root)

    def names(self) -> list[str]:
        """Every model folder (hidden folders and loose files are not models)."""
        return self._listing.names(_is_model_folder)

    def source(self, name: str) -> ModelSource:
        """The model's config and where it came from; a peer's fields it ignores are logged
        (once per content of its config file)."""
        found, parsed = self.configs.source(self._folder(name), name, read_source)
        warning = found.warning() if parsed else None
        if warning is not None:
            log.warning("%s", warning)
        return found

    def config(self, name: str) -> ModelConfig:
        """The model's validated config; NotFound when there is no such folder."""
        return self.source(name).config

    def versions(self, name: str, source: ModelSource | None = None) -> list[ModelVersion]:
        """The versions to serve under the config's version policy, ascending.

        A folder without version folders whose model file lies in it (MLServer's layout) is
        served as version 1.
        """
        source = source or self.source(name)
        config = source.config
        folder = self._folder(name)
        on_disk = {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}
        if config.is_pipeline and not on_disk:  # no model file, and no version folder: 1
            return [ModelVersion(name, 1, folder, folder, config, source.path)]
        if not on_disk:
            flat = [f for f in config.model_files() if _is_model(folder / f)]
            if flat:
                return [ModelVersion(name, 1, folder, folder / flat[0], config, source.path)]
            raise ConfigError(
                f"{folder}: no version folders (expected {folder}/1/{config.model_files()[0]})"
            )
        chosen = config.version_policy.select(list(on_disk))
        if not chosen:
            raise ConfigError(
                f"{folder}: field 'version_policy': selects none of the versions "
                f"on disk {sorted(on_disk)}"
            )
        if config.is_pipeline:  # Triton's empty version folders: the folder stands for a file
            return [
                ModelVersion(name, v, on_disk[v], on_disk[v], config, source.path) for v in chosen
            ]
        return [self._version(name, v, on_disk[v], source) for v in chosen]

    def version(self, name: str, version: int | None = None) -> ModelVersion:
        """One version (the newest served one when `version` is None)."""
        served = self.versions(name)
        if version is None:
            return served[-1]
        for mv in served:
            if mv.version == version:
                return mv
        raise NotFound(
            f"model {name!r} has no version {version} (served: {[m.version for m in served]})"
        )

    def check(self) -> list[CheckResult]:
        """Each model folder's config and version layout, without loading any runtime."""
        results = []
        for name in self.names():
            try:
                found = tuple(mv.version for mv in self.versions(name))
                results.append(CheckResult(name, found, None))
            except DlscaleError as exc:
                results.append(CheckResult(name, (), str(exc)))
        return results

    def _folder(self, name: str) -> Path:
        folder = self.root / name
        if not folder.is_dir() or name.startswith((".", "_")) or "/" in name:
            raise NotFound(f"unknown model {name!r} in {self.root} (models: {self.names()})")
        return folder

    def _version(self, name: str, version: int, path: Path, source: ModelSource) -> ModelVersion:
        config = source.config
        for file_name in config.model_files():
            if _is_model(path / file_name):
                return ModelVersion(name, version, path, path / file_name, config, source.path)
        raise ConfigError(
            f"{path}: no model file for backend {config.backend!r} "
            f"(expected one of {list(config.model_files())})"
        )


def _is_model_folder(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith((".", "_"))


def _is_model(path: Path) -> bool:
    """A model file, or a model folder (a TensorFlow SavedModel: `model.savedmodel/`)."""
    return path.is_file() or (path.suffix == ".savedmodel" and path.is_dir())
