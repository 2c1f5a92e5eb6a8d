"""ONNX Runtime backend: CPU, or CUDA and TensorRT providers where onnxruntime-gpu sees a GPU."""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.backends.confined import onnx_tensors
from dlscale.errors import BackendError, ConfigError, InvalidInput
from dlscale.native import process_folder
from dlscale.types import Datatype, TensorSpec
from dlscale.wire.tensors import as_bytes, as_text

log = logging.getLogger(__name__)

#: ONNX Runtime's type of each datatype's tensors: "tensor(<its numpy dtype's name>)", but for
#: these three, named as ONNX names them.
_ORT_NAMES = {"float32": "float", "float64": "double", "object": "string"}
_ORT_TYPES: dict[str, Datatype] = {
    f"tensor({_ORT_NAMES.get(d.numpy.name, d.numpy.name)})": d for d in Datatype
}
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def providers_for(device: str, extra: Mapping[str, Any]) -> list[Any]:
    """Execution providers for a device, most capable first; raises when the device is absent."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ConfigError(
            f"device {device!r} needs onnxruntime's CUDA provider, which this onnxruntime build "
            f"lacks (providers: {available}); install onnxruntime-gpu or use device 'cpu'"
        )
    # A MIG UUID is made visible to this process as its only device, which is then index 0.
    device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    chosen: list[Any] = []
    if extra.get("tensorrt") and "TensorrtExecutionProvider" in available:
        trt = {"device_id": device_id, "trt_fp16_enable": bool(extra.get("trt_fp16", False))}
        chosen.append(("TensorrtExecutionProvider", trt))
    chosen.append(("CUDAExecutionProvider", {"device_id": device_id}))
    chosen.append("CPUExecutionProvider")
    return chosen


#: The most bytes of optimized graphs the process keeps on disk (docs/memory.md, "Loads that
#: do not redo work"), and the largest graph kept: a quarter, so one model cannot flush the rest.
GRAPH_CACHE_BYTES = 1 << 30
#: The most model files remembered (digests, and files not kept: external data, too large,
#: not optimizable).
MAX_REMEMBERED = 10_000
#: A file changed less than this long ago is hashed again at each load (see `_digest`).
RACY_S = 2.0

Key = tuple[str, str, str, str]


class OptimizedGraphs:
    """Graphs ONNX Runtime optimized once, kept as files in a folder of this process's own
    (mode 0700, made at first use, removed with the process or by `clear`), bounded in bytes,
    the least recently used dropped first.

    The key is the model file's content (SHA-256) with what shapes the optimized graph (level,
    providers, runtime version): a changed file is a new key, never a stale graph. A later load
    reads the kept file with optimization off. Nothing of it comes from a request or a config.
    """

    def __init__(self, max_bytes: int = GRAPH_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._files: OrderedDict[Key, tuple[Path, int]] = OrderedDict()
        self._passed: set[Key] = set()  # known not to be kept
        self._digests: dict[str, tuple[tuple[int, ...], str]] = {}  # path: (identity, digest)
        #: Where the graphs are kept (None before the first).
        self.folder: Path | None = None
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes of the graphs kept now."""
        with self._lock:
            return sum(size for _, size in self._files.values())

    def clear(self) -> None:
        """Forget every graph and remove the folder (sessions built from them are unaffected:
        a session reads its file whole)."""
        with self._lock:
            folder, self.folder = self.folder, None
            self._files.clear()
            self._passed.clear()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def graph(self, path: Path, level: str, providers: list[Any]) -> Path | None:
        """The file of the optimized graph of the model at `path`, made once; None where it is
        not kept (above the largest entry, weights in other files, or a model ONNX Runtime
        cannot optimize: the plain load then says why)."""
        try:
            digest = self._digest(path)
        except OSError:
            return None
        if digest is None:
            return None
        key = (digest, level, repr(providers), ort.__version__)
        with self._lock:
            kept = self._files.get(key)
            if kept is not None:
                self._files.move_to_end(key)
                self.hits += 1
                return kept[0]
            if key in self._passed:
                return None
            out = self._made_folder() / f"{digest[:40]}-{len(self._files)}-{self.misses}.onnx"
            self.misses += 1
        made = _optimize(path, level, providers, out, self.max_bytes // 4)
        if not made:
            out.unlink(missing_ok=True)
        self._keep(key, out if made else None)
        log.debug("%s: optimized graph %s.. kept: %s", path, digest[:12], made)
        return out if made else None

    def _digest(self, path: Path) -> str | None:
        """The SHA-256 of the file's content (None above the largest entry). Hashing costs as
        much as the load of a small model, so a digest is remembered by the file's identity
        and times, once the file is older than RACY_S (as git does): a write within the file
        system's clock tick of the hash would leave those unchanged."""
        stat = path.stat()
        if stat.st_size > self.max_bytes // 4:
            return None
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        with self._lock:
            known = self._digests.get(str(path))
        if known is not None and known[0] == identity:
            return known[1]
        with path.open("rb") as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > RACY_S * 1e9:
            with self._lock:
                if len(self._digests) >= MAX_REMEMBERED:
                    self._digests.clear()
                self._digests[str(path)] = (identity, digest)
        return digest

    def _made_folder(self) -> Path:
        if self.folder is None:
            self.folder = process_folder(FOLDER_PREFIX)
            weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        return self.folder

    def _keep(self, key: Key, out: Path | None) -> None:
        with self._lock:
            if out is None:
                if len(self._passed) >= MAX_REMEMBERED:
                    self._passed.clear()
                self._passed.add(key)
                return
            if out.parent != self.folder or not out.is_file():
                return  # cleared meanwhile
            self._files[key] = (out, out.stat().st_size)
            held = sum(size for _, size in self._files.values())
            while held > self.max_bytes:
                dropped, size = self._files.popitem(last=False)[1]
                dropped.unlink(missing_ok=True)
                held -= size


#: The kept graphs' folder in the temporary directory (dlscale.native.process_folder).
FOLDER_PREFIX = "dlscale-ort-"


#: The process's optimized graphs (a graph is the runtime's, the same for every server in it).
GRAPHS = OptimizedGraphs()


def _optimize(path: Path, level: str, providers: list[Any], out: Path, most: int) -> bool:
    """Optimize the model at `path` into `out`; False when ONNX Runtime cannot, the model keeps
    weights in other files (not in the key), or the graph is larger than `most` bytes."""
    so = ort.SessionOptions()
    so.graph_optimization_level = _OPT_LEVELS[level]
    # One core for a load's optimizer, not the pool of every core that serving sessions share.
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.optimized_model_filepath = str(out)
    # Its warning that a graph optimized at level "all" may hold host-specific kernels does
    # not apply: the graph is used in this process only.
    so.log_severity_level = 3
    try:
        graph = onnx.load_model(str(path), load_external_data=False).graph
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx_tensors([graph])):
            return False
        ort.InferenceSession(str(path), so, providers=providers)
        return out.stat().st_size <= most
    except Exception as exc:  # onnx's and onnxruntime's errors: the plain load reports them
        log.debug("%s: not optimized ahead: %s", path, exc)
        return False


def _from_kept(graph: Path, so: ort.SessionOptions, providers: list[Any]) -> Any:
    """A session from a kept optimized graph, optimization off; None when it cannot be read
    (dropped by the bound meanwhile): the plain load follows."""
    level = so.graph_optimization_level
    so.graph_optimization_level = _OPT_LEVELS["disable"]
    try:
        return ort.InferenceSession(str(graph), so, providers=providers)
    except Exception as exc:  # onnxruntime's untyped errors
        log.debug("%s: kept graph not read: %s", graph, exc)
        so.graph_optimization_level = level
        return None


def _spec(arg: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise ConfigError(f"tensor {arg.name!r} has type {arg.type}, which dlscale cannot serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
    return TensorSpec(arg.name, dtype, shape)


def _to_runtime(name: str, array: np.ndarray) -> np.ndarray:
    """Arrays as onnxruntime takes them: BYTES elements as str (it would str() bytes: "b'..'")."""
    if array.dtype != object:
        return array
    try:
        return np.vectorize(as_text, otypes=[object])(array) if array.size else array
    except UnicodeDecodeError:
        raise InvalidInput(
            f"BYTES input {name!r} holds bytes that are not UTF-8; onnxruntime string tensors "
            "take UTF-8 text only"
        ) from None


def _from_runtime(array: np.ndarray) -> np.ndarray:
    """String outputs back as the protocol's BYTES elements (UTF-8 bytes)."""
    if array.dtype != object or not array.size:
        return array
    converted: np.ndarray = np.vectorize(as_bytes, otypes=[object])(array)
    return converted


class OnnxRuntimeBackend:
    """One InferenceSession; `run` releases the GIL, so instances compute in parallel threads."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        if options.graph_optimization_level not in _OPT_LEVELS:
            raise ConfigError(
                f"graph_optimization_level {options.graph_optimization_level!r}: expected one "
                f"of {list(_OPT_LEVELS)}"
            )
        self.path = Path(path)
        self.options = options
        self._session: ort.InferenceSession | None = None
        #: The session's tensors, read at load.
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

    def load(self) -> None:
        """Create the session on the configured device and read its signature."""
        so = ort.SessionOptions()
        so.graph_optimization_level = _OPT_LEVELS[self.options.graph_optimization_level]
        so.intra_op_num_threads = self.options.intra_op_threads
        so.inter_op_num_threads = self.options.inter_op_threads
        # Threads spin while idle by default; with many instances on few cores that spinning
        # steals the cores other instances compute on.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = providers_for(self.options.device, self.options.extra)
        # A load runs in its instance's thread at the normal priority. A thread niced below the
        # serving ones made resident requests slower, not faster (docs/memory.md): it holds the
        # GIL at times, and while the OS keeps it waiting, so does every thread of the server.
        level = self.options.graph_optimization_level
        graph = GRAPHS.graph(self.path, level, providers) if self._keeps_graph() else None
        self._session = self._open(graph, so, providers)
        self.inputs = [_spec(a) for a in self._session.get_inputs()]
        self.outputs = [_spec(a) for a in self._session.get_outputs()]
        log.debug("loaded %s with providers %s", self.path, self._session.get_providers())

    def _keeps_graph(self) -> bool:
        """Whether its optimized graph is kept: on the CPU (GPU providers' graphs are untested
        yet), at an optimization level that optimizes."""
        return self.options.device == "cpu" and self.options.graph_optimization_level != "disable"

    def _open(self, graph: Path | None, so: ort.SessionOptions, providers: list[Any]) -> Any:
        """A session from the kept optimized graph, else from the model file."""
        session = _from_kept(graph, so, providers) if graph is not None else None
        try:
            return session or ort.InferenceSession(str(self.path), so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors for bad files
            raise ConfigError(f"{self.path}: onnxruntime cannot load it: {exc}") from exc

    @property
    def capabilities(self) -> Capabilities:
        """One batch at a time, on host arrays; small batches measured cheap on the event loop
        (a session's `run` computes on the calling thread and waits on no other process)."""
        return Capabilities(inline_measured=True)

    @property
    def providers(self) -> list[str]:
        """The execution providers the session really uses."""
        return self._session.get_providers() if self._session else []

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; every output is returned."""
        if self._session is None:
            raise BackendError(f"{self.path}: infer called before load")
        names = [o.name for o in self.outputs]
        feed = {n: _to_runtime(n, a) for n, a in inputs.items()}
        try:
            results = self._session.run(names, feed)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as exc:
            raise InvalidInput(f"the model refused the inputs: {exc}") from exc
        except Exception as exc:
            raise BackendError(f"onnxruntime failed: {exc}") from exc
        return {n: _from_runtime(r) for n, r in zip(names, results, strict=True)}

    def unload(self) -> None:
        """Drop the session (its memory is freed when the last reference goes)."""
        self._session = None
