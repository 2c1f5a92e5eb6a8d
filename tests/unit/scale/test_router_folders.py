"""The router's folders: one left by a router that died without stopping (a router actor Ray
killed, a SIGKILL) is removed by the next router; a live router's, or one being made, is not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TMPDIR as a short folder: under a worker's deep tmp_path the router would move to /tmp
    (HAProxy's 97-byte socket path), away from the folders this test made."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        monkeypatch.setattr(tempfile, "tempdir", folder)
        yield Path(folder)


def test_a_new_router_removes_the_folders_of_routers_that_died(short_tmp: Path) -> None:
    orphan = _folder(short_tmp, "orphan", _dead_pid())
    live = _folder(short_tmp, "live", os.getpid())
    being_made = _folder(short_tmp, "new", None)
    other = short_tmp / "someone-else"
    other.mkdir()
    (other / "owner.pid").write_text(str(_dead_pid()))

    router = HaproxyRouter("127.0.0.1", 0, None)
    try:
        assert router.workdir.parent == short_tmp
        assert (router.workdir / "owner.pid").read_text() == str(os.getpid())
        assert not orphan.exists()
        assert live.exists() and being_made.exists() and other.exists()
    finally:
        router.stop()
    assert not router.workdir.exists()
