"""What a repository would read again at every load, read once: each model's config once per
content of its config file, and the repository's listing once per change of its folder
(docs/memory.md, "What a load costs and where it runs")."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from dlscale.models.sources import CONFIG_FILES, ModelSource

#: Parsed configs remembered at most (one per model folder); beyond, the least recently used
#: goes, so a repository of very many models costs a parse per load, not unbounded memory.
MAX_CONFIGS = 10_000
#: A config file above this is parsed at every read (its content is the key, kept in memory).
MAX_CONFIG_BYTES = 1 << 20
#: A folder changed less than this long ago is listed again at each call (git's "racy" rule):
#: an entry added within the file system's clock tick of a listing leaves its times unchanged.
RACY_S = 2.0

Reader = Callable[[Path, str], ModelSource]


class Configs:
    """Each model folder's parsed and validated config, by the bytes of its config file.

    The key is the content, not the file's times: an edit is seen whatever the clock's
    resolution, and reading a small file costs far less than parsing and validating it."""

    def __init__(self, capacity: int = MAX_CONFIGS) -> None:
        self.capacity = capacity
        self._known: OrderedDict[tuple[Path, str], tuple[str, bytes, ModelSource]] = OrderedDict()
        self._lock = threading.Lock()
        #: How many reads parsed the file (the others were answered from memory).
        self.parsed = 0

    def source(self, folder: Path, name: str, read: Reader) -> tuple[ModelSource, bool]:
        """The config of model `name` in `folder`, and whether it was parsed now (`read` does
        the parsing: models/sources.py's `read_source`)."""
        found = _config_file(folder)
        content = _content(found) if found is not None else None
        key = (folder, name)
        if found is not None and content is not None:
            with self._lock:
                known = self._known.get(key)
                if known is not None and known[:2] == (found.name, content):
                    self._known.move_to_end(key)
                    return known[2], False
        source = read(folder, name)
        with self._lock:
            self.parsed += 1
        if found is None or content is None or not _only_from(source, found):
            return source, True
        if _content(found) == content:  # kept only when unchanged while it was parsed
            self._keep(key, (found.name, content, source))
        return source, True

    def _keep(self, key: tuple[Path, str], value: tuple[str, bytes, ModelSource]) -> None:
        with self._lock:
            self._known[key] = value
            self._known.move_to_end(key)
            while len(self._known) > self.capacity:
                self._known.popitem(last=False)


class Listing:
    """A folder's entries, listed again only when the folder changed (or changed lately)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: tuple[int, int, int] | None = None
        self._names: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def names(self, keep: Callable[[Path], bool]) -> list[str]:
        """The sorted names of the entries `keep` accepts (the same `keep` at every call)."""
        stat = self.root.stat()
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
        with self._lock:
            if stamp == self._stamp:
                return list(self._names)
        names = tuple(sorted(p.name for p in self.root.iterdir() if keep(p)))
        if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > RACY_S * 1e9:
            with self._lock:
                self._stamp, self._names = stamp, names
        return list(names)


def _config_file(folder: Path) -> Path | None:
    """The config file the folder's config is read from (the first of CONFIG_FILES found)."""
    return next((p for p in (folder / f for f in CONFIG_FILES) if p.is_file()), None)


def _content(path: Path) -> bytes | None:
    """The file's bytes; None when it is too large to keep or cannot be read."""
    try:
        with path.open("rb") as file:
            content = file.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    return content if len(content) <= MAX_CONFIG_BYTES else None


def _only_from(source: ModelSource, found: Path) -> bool:
    """Whether `source` depends on the config file alone. A config.pbtxt may be completed
    from other files, which its content does not cover: a Python model's by its model.py's
    `auto_complete_config` (models/triton_config.py), an ONNX model's that declares no tensors
    by its model file (models/sources.py's `complete`)."""
    if source.path != found:
        return False
    if found.name != "config.pbtxt":
        return True
    config = source.config
    from_onnx = config.backend == "onnxruntime" and not (config.inputs or config.outputs)
    return not (config.backend == "python" or from_onnx)
