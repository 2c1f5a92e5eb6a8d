"""Triton's `auto_complete_config`: a Triton model.py completing its own config at load.

Triton calls `TritonPythonModel.auto_complete_config(auto_complete_model_config)` once at load,
in a throwaway interpreter, and serves the config it returns. dlscale does the same: a short
child process (`python -m dlscale.backends.python.autocomplete`) imports the model.py, calls
the method on a `ModelConfig` holding the config's JSON form, and prints the completed form.
The server process never imports the user's code (loader.py says why). Results are kept per
(file, its modification time, the config given), so reading a config again costs nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError

#: The method Triton calls; the class it belongs to.
METHOD, CLASS = "auto_complete_config", "TritonPythonModel"
#: How long the child may take (imports of heavy libraries included).
TIMEOUT_S = 120.0
_done: dict[tuple[str, int, str], dict[str, Any]] = {}


def auto_complete(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The config (Triton's JSON form) as the model.py at `path` completes it."""
    given = json.dumps(config, sort_keys=True)
    key = (str(path.resolve()), path.stat().st_mtime_ns, given)
    if key not in _done:
        _done[key] = _run(path, given)
    copy: dict[str, Any] = json.loads(json.dumps(_done[key]))  # one the caller may change
    return copy


def _run(path: Path, given: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(path)],
            input=given,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{path}: {CLASS}.{METHOD} ran past {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"{path}: {CLASS}.{METHOD} failed: {last}")
    try:
        completed = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise ConfigError(f"{path}: {CLASS}.{METHOD} printed no config") from None
    if not isinstance(completed, dict):
        raise ConfigError(f"{path}: {CLASS}.{METHOD} returned {completed!r}, not a config")
    return completed


def _main(path: str) -> None:
    """The child: complete the config read from stdin with the model.py at `path`."""
    from dlscale.backends.python.loader import load_module
    from dlscale.backends.python.pb_config import ModelConfig

    module = load_module(Path(path), "autocomplete")
    config = ModelConfig(json.loads(sys.stdin.read()))
    returned = getattr(module, CLASS).auto_complete_config(config)
    if not isinstance(returned, ModelConfig):
        raise SystemExit(f"it returned {type(returned).__name__}, not the ModelConfig it was given")
    sys.stdout.write("\n" + json.dumps(returned.as_dict()) + "\n")


if __name__ == "__main__":
    _main(sys.argv[1])
