"""What a model needs loaded before it: a pipeline's step models and an adapter's base model,
loaded from the manager's repository only (a name, never a path), a circle refused."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from dlscale.errors import ConfigError, DlscaleError, NotFound, root_cause
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.serving.pipeline import check_nesting
from dlscale.serving.served import ServedVersion


class Models(Protocol):
    """What loading a dependency needs of the model manager."""

    repository: ModelRepository

    def ready_names(self) -> list[str]: ...

    def get(self, name: str, version: str = "") -> ServedVersion: ...

    async def load(
        self, name: str, *, chain: tuple[str, ...] = (), cold_only: bool = False
    ) -> None: ...


def config_of(repository: ModelRepository, name: str) -> ModelConfig | None:
    """The repository's config of `name`; None when unreadable (its load says why)."""
    try:
        return repository.config(name)
    except DlscaleError:
        return None


async def load_steps(
    models: Models, pipeline: str, wanted: tuple[str, ...], chain: tuple[str, ...]
) -> None:
    """Load a pipeline's step models that are not loaded, from the models' repository."""
    circle = [m for m in wanted if m in chain]
    if circle:
        raise ConfigError(f"pipeline {pipeline!r} uses itself: {' -> '.join((*chain, circle[0]))}")
    loadable = set(models.repository.names())
    missing = [m for m in wanted if m not in models.ready_names() and m not in loadable]
    if missing:
        raise ConfigError(
            f"pipeline {pipeline!r} uses models {missing}, which are neither loaded nor in "
            "the repository"
        )
    for model in wanted:
        if model not in models.ready_names():
            # A pipeline is refused before loading deeper: bounded recursion.
            config = config_of(models.repository, model)
            if config is not None and config.is_pipeline:
                check_nesting((*chain, model))
            try:
                await models.load(model, chain=chain)
            except DlscaleError as exc:
                # The cause only, not each nested pipeline's words for it again.
                cause = root_cause(exc)
                raise ConfigError(
                    f"pipeline {pipeline!r}: its step model {model!r} failed to load: {cause}"
                ) from cause


async def load_base(
    models: Models, name: str, versions: list[ModelVersion], chain: tuple[str, ...]
) -> list[ModelVersion]:
    """Load an adapter's base model when it is not loaded (from the models' repository
    only: a name, never a path), and measure the adapter on the base's devices."""
    base = versions[0].config.base
    if base == name or base in chain:
        raise ConfigError(f"adapter {name!r} names itself (or its chain) as its base")
    if base not in models.ready_names():
        if base not in models.repository.names():
            raise NotFound(
                f"adapter {name!r}: its base model {base!r} is neither loaded nor in the "
                "model repository"
            )
        try:
            await models.load(base, chain=(*chain, name), cold_only=True)
        except DlscaleError as exc:
            cause = root_cause(exc)
            raise ConfigError(
                f"adapter {name!r}: its base model {base!r} failed to load: {cause}"
            ) from cause
    instances = models.get(base).config.instances
    return [
        dataclasses.replace(mv, config=mv.config.model_copy(update={"instances": instances}))
        for mv in versions
    ]
