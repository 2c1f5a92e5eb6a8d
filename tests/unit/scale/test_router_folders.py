"""The router's folders: one left by a router that died without stopping (a router actor Ray
killed, a SIGKILL) is removed by the next router; a live process's, or one not named by a
process, is not (dlscale.native.process_folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlscale.scale.haproxy import FOLDER_PREFIX, HaproxyRouter


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _folder(parent: Path, owner: int | str) -> Path:
    folder = parent / f"{FOLDER_PREFIX}{owner}-x"
    folder.mkdir()
    (folder / "haproxy.cfg").write_text("global\n")
    return folder


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TMPDIR as a short folder: under a worker's deep tmp_path the router would move to /tmp
    (HAProxy's 97-byte socket path), away from the folders this test made."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        monkeypatch.setattr(tempfile, "tempdir", folder)
        yield Path(folder)


def test_a_new_router_removes_the_folders_of_routers_that_died(short_tmp: Path) -> None:
    orphan = _folder(short_tmp, _dead_pid())
    live = _folder(short_tmp, os.getpid())
    unnamed = _folder(short_tmp, "abc")
    other = short_tmp / f"dlscale-ort-{_dead_pid()}-x"  # another kind's: its maker sweeps it
    other.mkdir()

    router = HaproxyRouter("127.0.0.1", 0, None)
    try:
        assert router.workdir.parent == short_tmp
        assert router.workdir.name.startswith(f"{FOLDER_PREFIX}{os.getpid()}-")
        assert not orphan.exists()
        assert live.exists() and unnamed.exists() and other.exists()
    finally:
        router.stop()
    assert not router.workdir.exists()
