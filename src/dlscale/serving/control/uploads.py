"""Loading with overrides (Triton's repository extension): a config, and files, in the request.

`config` is the JSON form of Triton's ModelConfig and replaces the repository's config for that
load. `file:<version>/<name>` parameters carry model files; they are written to a model folder
the server owns (under a temporary root, within a size bound), which replaces the repository's
folder for that load and is deleted when the model is unloaded or loaded again without files.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from dlscale.errors import InvalidInput, PayloadTooLarge, PermissionDenied
from dlscale.models.repository import ModelRepository
from dlscale.models.sources import ModelSource
from dlscale.models.triton_config import convert, parse_json
from dlscale.serving.control.bounds import check_override

log = logging.getLogger("dlscale.models")

FILE_PREFIX = "file:"
#: Files all uploaded models may hold together on disk, by default.
MAX_UPLOAD_BYTES = 4 * 2**30


class Uploads:
    """The server's folders of models loaded from files in a load request.

    `override` decodes and writes in a worker thread (DataPlane.load_model), so that a large
    upload does not hold the event loop: the folders change under a lock."""

    def __init__(self, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
        self.max_bytes = max_bytes
        self._root: Path | None = None
        self._lock = threading.Lock()

    def override(
        self, name: str, parameters: Mapping[str, str | bytes]
    ) -> tuple[ModelSource, ModelRepository | None] | None:
        """The config and (with files) the repository a load request asks for, or None when it
        asks for neither. Files are written before the answer; a refused request writes none."""
        unknown = sorted(k for k in parameters if k != "config" and not k.startswith(FILE_PREFIX))
        if unknown:
            raise InvalidInput(
                f"unknown load parameters {unknown}: expected 'config' and 'file:<version>/<name>'"
            )
        text = parameters.get("config")
        files = {k[len(FILE_PREFIX) :]: v for k, v in parameters.items() if k != "config"}
        if text is None:
            if files:
                raise InvalidInput("loading from files needs the 'config' parameter too")
            return None
        if not isinstance(text, str):
            raise InvalidInput("load parameter 'config' must be a string (a JSON ModelConfig)")
        where = f"load request for {name!r}, parameter 'config'"
        config, ignored = convert(parse_json(text, where), name, where)
        check_override(config)
        source = ModelSource(config, Path(f"<{where}>"), ignored)
        if source.warning():
            log.warning("%s", source.warning())
        if not files:
            return source, None
        if config.backend == "python":
            # A model.py runs with the server's rights: code comes from the repository only.
            raise PermissionDenied(
                f"model {name!r}: a load request may not upload Python code (backend 'python'); "
                "put its model.py in the model repository"
            )
        with self._lock:
            return source, self._write(name, files)

    def discard(self, name: str) -> None:
        """Delete a model's uploaded folder, if it has one."""
        with self._lock:
            if self._root is not None and (self._root / name).exists():
                shutil.rmtree(self._root / name, ignore_errors=True)

    def names(self) -> list[str]:
        """Models whose files came in a load request."""
        if self._root is None:
            return []
        return sorted(p.name for p in self._root.iterdir() if p.is_dir())

    def close(self) -> None:
        """Delete every uploaded folder (at shutdown)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _write(self, name: str, files: Mapping[str, str | bytes]) -> ModelRepository:
        if name in (".", ".."):
            raise InvalidInput(f"{name!r} is not a model name")
        paths: dict[PurePosixPath, bytes] = {}
        for key, data in files.items():
            if not isinstance(data, bytes):
                raise InvalidInput(f"load parameter 'file:{key}' must carry bytes")
            paths[_relative(key)] = data
        folders = {parent for path in paths for parent in path.parents}
        clash = sorted(str(p) for p in paths if p in folders)
        if clash:
            raise InvalidInput(f"load files {clash} are named both as files and as folders")
        size = sum(len(d) for d in paths.values())
        used = sum(f.stat().st_size for f in self._folder().rglob("*") if f.is_file())
        used -= sum(f.stat().st_size for f in (self._folder() / name).rglob("*") if f.is_file())
        if used + size > self.max_bytes:
            raise PayloadTooLarge(
                f"the model files ({size} bytes) would take uploaded models above the server's "
                f"limit of {self.max_bytes} bytes; unload some first"
            )
        folder = self._folder() / name
        shutil.rmtree(folder, ignore_errors=True)
        try:
            for relative, data in paths.items():
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except OSError as exc:  # e.g. a name too long for the file system: the client's
            shutil.rmtree(folder, ignore_errors=True)
            raise InvalidInput(f"the load files cannot be written: {exc.strerror}") from None
        return ModelRepository(self._folder())

    def _folder(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="dlscale-uploads-"))
        return self._root


def _relative(key: str) -> PurePosixPath:
    """`<version>/<name>` as a path that stays inside the model's folder."""
    path = PurePosixPath(key)
    if any(ord(c) < 32 for c in key):
        raise InvalidInput(
            f"load parameter 'file:{key!r}': a file name may not hold control characters"
        )
    if (
        len(path.parts) < 2
        or not path.parts[0].isdigit()
        or int(path.parts[0]) < 1
        or path.is_absolute()
        or ".." in path.parts
    ):
        raise InvalidInput(
            f"load parameter 'file:{key}': expected 'file:<version>/<file name>' with a "
            "positive version, inside the model's folder"
        )
    return path
