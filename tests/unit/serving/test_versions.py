"""Which version a request means: the one rule the DataPlane and the Ray router share."""

from __future__ import annotations

import pytest

from dlscale.errors import NotFound
from dlscale.serving.versions import resolve_version


def test_the_newest_when_none_is_named() -> None:
    assert resolve_version("m", "", {1, 3, 2}) == 3


def test_a_served_version_by_its_number() -> None:
    assert resolve_version("m", "2", {1, 2}) == 2


@pytest.mark.parametrize("version", ["7", "v1", "-1", "1.0", " 1"])
def test_anything_else_is_not_found_with_the_served_versions(version: str) -> None:
    with pytest.raises(NotFound, match=r"model 'm' has no version .* \(served: \[1, 2\]\)"):
        resolve_version("m", version, {1, 2})
