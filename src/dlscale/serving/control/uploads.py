"""Loading with overrides (Triton's repository extension): a config, and files, in the request.

`config` is the JSON form of Triton's ModelConfig and replaces the repository's config for that
load. `file:<version>/<name>` parameters carry model files; they are written to a model folder
the server owns (under a temporary root, within a size bound), which replaces the repository's
folder for that load and is deleted when the model is unloaded or loaded again without files.

A client may upload only data whose loading runs no code it chose (issue 33: a `model.zoo`
naming `subprocess:run` ran a shell command): each backend names the files it reads as data
(`dlscale.backends.RUNTIMES`), anything else is refused before a byte is written, and an ONNX
model's external data must stay in its folder.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from dlscale.backends import RUNTIMES, check_upload, uploadable
from dlscale.backends.confined import external_data_outside
from dlscale.errors import ConfigError, InvalidInput, PayloadTooLarge, PermissionDenied
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository
from dlscale.models.sources import ModelSource
from dlscale.models.triton_config import convert, parse_json
from dlscale.serving.control.bounds import check_override

log = logging.getLogger("dlscale.models")

FILE_PREFIX = "file:"
#: Names in an uploaded file's path, its version included (a Hugging Face folder nests a few).
MAX_FILE_DEPTH = 8
#: A version folder's name: a positive integer in ASCII digits ("¹" is a digit to str.isdigit).
_VERSION = re.compile(r"[1-9][0-9]{0,8}")
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
        for key in files:
            _relative(key)
        check_data_only(name, config, files)
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


def check_data_only(name: str, config: ModelConfig, files: Mapping[str, str | bytes]) -> None:
    """PermissionDenied unless every uploaded file is data for the config's backend."""
    backend = "pipeline" if config.is_pipeline else config.backend
    refused = sorted(
        key
        for key in files
        if config.is_pipeline or not uploadable(backend, PurePosixPath(key).name)
    )
    if refused:
        allowed = RUNTIMES[backend].uploads if backend in RUNTIMES else ()
        raise PermissionDenied(
            f"model {name!r}: a load request may not upload {refused} for backend "
            f"{backend!r}: a file whose loading could run code (Python, pickles, TorchScript, "
            "compiled libraries, vLLM engine arguments) comes from the model repository only; "
            f"this backend takes {list(allowed) or 'no files'} from a load request"
        )
    for key, data in files.items():
        if isinstance(data, bytes):
            check_upload(backend, PurePosixPath(key).name, data)
        if key.endswith(".onnx") and isinstance(data, bytes):
            try:
                outside = external_data_outside(data)
            except ConfigError as exc:
                raise InvalidInput(f"load parameter 'file:{key}': {exc}") from None
            if outside:
                raise PermissionDenied(
                    f"load parameter 'file:{key}': the model's external data {outside} would be "
                    "read from outside its folder; name files uploaded beside it"
                )


def _relative(key: str) -> PurePosixPath:
    """`<version>/<name>` as a path that stays inside the model's folder, a few folders deep."""
    path = PurePosixPath(key)
    if any(ord(c) < 32 for c in key):
        raise InvalidInput(
            f"load parameter 'file:{key!r}': a file name may not hold control characters"
        )
    if (
        not 2 <= len(path.parts) <= MAX_FILE_DEPTH
        or not _VERSION.fullmatch(path.parts[0])
        or path.is_absolute()
        or ".." in path.parts
    ):
        raise InvalidInput(
            f"load parameter 'file:{key[:200]}': expected 'file:<version>/<file name>' with a "
            f"positive version in ASCII digits, inside the model's folder, at most "
            f"{MAX_FILE_DEPTH} names deep"
        )
    return path
