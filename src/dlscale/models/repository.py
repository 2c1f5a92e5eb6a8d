"""The model repository on disk: REPO/<model>/config.toml and REPO/<model>/<version>/<file>."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import ConfigError, DlscaleError, NotFound
from dlscale.models.config import ModelConfig, load_config


@dataclass(frozen=True)
class ModelVersion:
    """One servable version of a model: its folder, its model file and its config."""

    name: str
    version: int
    path: Path
    model_file: Path
    config: ModelConfig


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
    """Reads models from a folder; one broken model never hides the others."""

    def __init__(self, root: Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ConfigError(f"model repository {root} is not a folder")
        self.root = root

    def names(self) -> list[str]:
        """Every model folder (hidden folders and loose files are not models)."""
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
        )

    def config(self, name: str) -> ModelConfig:
        """The model's validated config; NotFound when there is no such folder."""
        folder = self._folder(name)
        return load_config(folder / "config.toml", expected_name=name)

    def versions(self, name: str, config: ModelConfig | None = None) -> list[ModelVersion]:
        """The versions to serve under the config's version policy, ascending."""
        config = config or self.config(name)
        folder = self._folder(name)
        on_disk = {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}
        if not on_disk:
            raise ConfigError(
                f"{folder}: no version folders (expected {folder}/1/{config.model_files()[0]})"
            )
        chosen = config.version_policy.select(list(on_disk))
        if not chosen:
            raise ConfigError(
                f"{folder / 'config.toml'}: field 'version_policy': selects none of the versions "
                f"on disk {sorted(on_disk)}"
            )
        return [self._version(name, v, on_disk[v], config) for v in chosen]

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

    def _version(self, name: str, version: int, path: Path, config: ModelConfig) -> ModelVersion:
        for file_name in config.model_files():
            if (path / file_name).is_file():
                return ModelVersion(name, version, path, path / file_name, config)
        raise ConfigError(
            f"{path}: no model file for backend {config.backend!r} "
            f"(expected one of {list(config.model_files())})"
        )
