"""Which model and version a request means: the one rule, for the DataPlane and the Ray router."""

from __future__ import annotations

from collections.abc import Callable, Collection

from dlscale.errors import NotFound, known_names


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


def unknown_model(name: str, repository: Callable[[], list[str]], loaded: list[str]) -> NotFound:
    """A request for a model not served: in the repository but not loaded (so said), or unknown
    (with the closest name and the loaded ones)."""
    try:
        in_repository = name in repository()
    except OSError:
        in_repository = False
    if in_repository:
        return NotFound(
            f"model {name!r} is in the repository but not loaded (load it: POST "
            f"/v2/repository/models/{name}/load, or start the server with --load-model)"
        )
    return NotFound(f"unknown model {name!r}" + known_names(name, loaded, "loaded"))
