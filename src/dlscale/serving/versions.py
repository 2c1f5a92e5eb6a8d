"""Which version of a model a request means: the one rule, for the DataPlane and the Ray router."""

from __future__ import annotations

from collections.abc import Collection

from dlscale.errors import NotFound


def resolve_version(model: str, version: str, served: Collection[int]) -> int:
    """The served version `version` names; the newest when it is empty.

    A version is the decimal number of its folder; anything else, or a version not served now,
    is NotFound with the versions that are.
    """
    if not version:
        return max(served)
    if not version.isdigit() or int(version) not in served:
        raise NotFound(f"model {model!r} has no version {version!r} (served: {sorted(served)})")
    return int(version)
