"""What the processing steps share: their settings read from [backend_options], their tensors
named by the config, and the rows of BYTES inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from dlscale.errors import ConfigError, InvalidInput
from dlscale.types import TensorSpec

Settings = TypeVar("Settings", bound="StepOptions")


class StepOptions(BaseModel):
    """A step's [backend_options]: typed, frozen, and unknown keys refused (a misspelt key
    would otherwise be served with its default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def read_options(kind: type[Settings], extra: Mapping[str, Any], step: str) -> Settings:
    """The step's settings from [backend_options]; a ConfigError naming each bad key."""
    try:
        return kind.model_validate(dict(extra))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{step} step: [backend_options] {problems}") from None


def bind(declared: Sequence[TensorSpec], made: Sequence[TensorSpec], role: str) -> list[TensorSpec]:
    """The step's tensors: those it makes, renamed as the config declares them (in order).

    A config may leave its tensors out (the step's own names serve) or declare them, to name
    them as a pipeline or a Triton user expects; then their datatypes and shapes must be those
    the settings make, or the load is refused.
    """
    if not declared:
        return list(made)
    if len(declared) != len(made):
        raise ConfigError(
            f"the config declares {len(declared)} {role}s, but the step's settings make "
            f"{len(made)}: {[s.described() for s in made]}"
        )
    bound = []
    for mine, theirs in zip(made, declared, strict=True):
        if theirs.datatype is not mine.datatype or not theirs.matches(mine.shape):
            raise ConfigError(
                f"{role} {theirs.name!r} is declared {theirs.described()}, but the step's settings "
                f"make {mine.described()}"
            )
        bound.append(TensorSpec(theirs.name, mine.datatype, mine.shape))
    return bound


def byte_rows(array: np.ndarray, name: str) -> list[object]:
    """One element per row of a BYTES input of shape [rows] or [rows, 1]."""
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        raise InvalidInput(
            f"input {name!r} has shape {list(array.shape)}: one element per row is expected"
        )
    return list(array.reshape(-1))


def as_bytes(element: object) -> bytes:
    """A BYTES element as bytes; InvalidInput (naming what it is) otherwise."""
    if isinstance(element, bytes | bytearray | memoryview):
        return bytes(element)
    raise InvalidInput(f"is a {type(element).__name__}, not bytes")
