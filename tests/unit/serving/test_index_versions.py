"""The repository index names the versions of models not loaded, read again only when the
model's folder or files change (issue 36: an index of 90 unloaded models parsed 90 configs)."""

from __future__ import annotations

from pathlib import Path

from tests.toolkit.models import write_null_model

from dlscale.serving.control.plane import ControlPlane
from dlscale.serving.manager import ModelManager

CONFIG = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)


def _versions(plane: ControlPlane) -> list[str]:
    return [row.version for row in plane.repository_index() if row.name == "m"]


def test_the_index_follows_version_folders_and_configs(tmp_path: Path) -> None:
    folder = write_null_model(tmp_path, "m", CONFIG)
    plane = ControlPlane(ModelManager.open(tmp_path))
    assert _versions(plane) == ["1"]
    assert _versions(plane) == ["1"]  # remembered
    (folder / "3").mkdir()
    (folder / "3" / "model.null").touch()
    assert _versions(plane) == ["3"]  # a new version folder: the newest is served
    (folder / "config.toml").write_text(
        'backend = "null"\n' + CONFIG + "[version_policy]\nall = true\n"
    )
    assert _versions(plane) == ["1", "3"]  # a changed config: read again
    (folder / "config.toml").write_text("not = [toml")
    assert _versions(plane) == [""]  # a config that cannot say: no versions, the reason does
