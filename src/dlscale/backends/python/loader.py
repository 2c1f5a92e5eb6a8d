"""Finding and importing a user's model.py: which API it speaks, its class, the pb_utils name.

The rule (docs/backends.md): a model.py that defines a class `TritonPythonModel` speaks Triton's
API; otherwise it must define a class `Model`, dlscale's own API. The API is read from the
source without running it, so that the server process never imports code meant for a worker.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import logging
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from dlscale.backends.base import BackendOptions, model_folder
from dlscale.backends.python import triton_python_backend_utils
from dlscale.backends.python.source import syntax_tree
from dlscale.errors import BackendError, ConfigError
from dlscale.types import TensorSpec

log = logging.getLogger("dlscale.python")

#: The class names the rule looks for, by API.
TRITON_CLASS = "TritonPythonModel"
NATIVE_CLASS = "Model"
#: The module name Triton's model.py files import.
PB_UTILS = "triton_python_backend_utils"

Api = Literal["triton", "native"]


@dataclass(frozen=True)
class UserModel:
    """What user code is told about its model: everything plain data, so a worker gets it too."""

    path: Path  # the model.py
    name: str
    version: int
    device: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: [backend_options] beyond the backend's own keys (native), or Triton's `parameters`.
    parameters: dict[str, Any] = field(default_factory=dict)
    #: Whether it answers with streams (backends/python/streaming.py).
    decoupled: bool = False

    @classmethod
    def at(
        cls, path: Path, options: BackendOptions, parameters: dict[str, Any], decoupled: bool
    ) -> UserModel:
        """The model whose model.py is at `path` (REPO/<name>/<version>/model.py), as loaded
        with `options`."""
        folder = path.parent
        name = model_folder(folder).name
        version = int(folder.name) if folder.name.isdigit() else 1
        tensors = (options.inputs, options.outputs)
        batch = options.max_batch_size
        return cls(path, name, version, options.device, batch, *tensors, parameters, decoupled)

    @property
    def repository(self) -> Path:
        """The model's folder (Triton's args['model_repository'])."""
        return model_folder(self.path.parent)


def api_of(path: Path) -> Api:
    """Which API the model.py at `path` speaks, read from its source (nothing is run)."""
    try:
        tree = syntax_tree(path)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the model's Python code: {exc}") from None
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    if TRITON_CLASS in names:
        return "triton"
    if NATIVE_CLASS in names:
        return "native"
    raise ConfigError(
        f"{path}: defines neither class {TRITON_CLASS!r} (Triton's Python backend) nor class "
        f"{NATIVE_CLASS!r} (dlscale's API); see docs/backends.md"
    )


def check_code(path: Path) -> None:
    """What can be known of a model.py without running it: it compiles, defines a model class,
    and each module it imports at its top level is installed (found, not imported)."""
    api_of(path)
    source = path.read_text()
    try:
        compile(source, str(path), "exec")  # compiled, not run: errors ast.parse lets through
    except (SyntaxError, ValueError) as exc:
        raise ConfigError(f"{path}: does not compile: {exc}") from None
    tree = syntax_tree(path, source)
    for name in sorted(_top_imports(tree)):
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"{path}: imports {name!r}, which is not installed here")


def _top_imports(tree: ast.Module) -> set[str]:
    """The packages the module's own body imports (absolute imports, not those in functions or
    in try blocks, which may be optional), pb_utils aside."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names - {PB_UTILS}


def user_class(model: UserModel, api: Api) -> type[Any]:
    """Import the model.py (under a name of its own) and return its model class."""
    path = model.path
    try:
        module = load_module(path, model.name)
    except Exception as exc:
        raise failure(model, "importing model.py", exc) from None
    cls = getattr(module, TRITON_CLASS if api == "triton" else NATIVE_CLASS)
    if not isinstance(cls, type):
        raise ConfigError(f"{path}: {cls!r} is not a class")
    return cls


def load_module(path: Path, name: str) -> ModuleType:
    """Import the model.py at `path` under a module name of its own (raises what it raises)."""
    # `import triton_python_backend_utils` gives dlscale's module: a name in sys.modules,
    # nothing written to site-packages.
    sys.modules.setdefault(PB_UTILS, triton_python_backend_utils)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"dlscale_user_model_{name}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: not a Python module")
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


class UserCodeError(BackendError):
    """User code raised: the client gets the message, the server log gets the traceback."""

    def __init__(self, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.trace = trace


def failure(model: UserModel, where: str, exc: BaseException) -> UserCodeError:
    """The error for an exception user code raised `where`, its traceback kept for the log."""
    trace = "".join(traceback.format_exception(exc))
    return UserCodeError(
        f"model {model.name!r}: {where} raised {type(exc).__name__}: {exc} "
        "(the traceback is in the server log)",
        trace,
    )


def log_failure(error: UserCodeError) -> None:
    """Write a user-code failure and its traceback to the server log."""
    log.error("%s\n%s", error, error.trace.rstrip())
