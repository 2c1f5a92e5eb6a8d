"""The router's folders: one left by a router that died without stopping (a router actor Ray
killed, a SIGKILL) is removed by the next router; a live router's, or one being made, is not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dlscale.scale.haproxy import HaproxyRouter


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _folder(parent: Path, name: str, owner: int | None) -> Path:
    folder = parent / f"dlscale-router-{name}"
    folder.mkdir()
    (folder / "haproxy.cfg").write_text("global\n")
    if owner is not None:
        (folder / "owner.pid").write_text(str(owner))
    return folder


def test_a_new_router_removes_the_folders_of_routers_that_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = _folder(tmp_path, "orphan", _dead_pid())
    live = _folder(tmp_path, "live", os.getpid())
    being_made = _folder(tmp_path, "new", None)
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / "owner.pid").write_text(str(_dead_pid()))

    router = HaproxyRouter("127.0.0.1", 0, None)
    try:
        assert router.workdir.parent == tmp_path
        assert (router.workdir / "owner.pid").read_text() == str(os.getpid())
        assert not orphan.exists()
        assert live.exists() and being_made.exists() and other.exists()
    finally:
        router.stop()
    assert not router.workdir.exists()
