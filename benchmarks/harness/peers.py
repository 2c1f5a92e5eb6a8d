"""Peer servers for side-by-side runs: Seldon MLServer and Triton, each in its own virtual env.

`ensure_mlserver()` installs it under .bench/mlserver-venv (uvloop<0.22: with 0.23 its workers
die at start-up, see shared/reference/peers.md). `mlserver_repository()` lays out the same ONNX
files with the same batching knobs as dlscale's config.toml, served by mlserver_runtime.py.
`ensure_pytriton()` installs nvidia-pytriton (the real tritonserver) under .bench/pytriton-venv;
pytriton_server.py serves with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.models import BenchModel

VENV = Path(".bench/mlserver-venv")
#: The runtime MLServer loads from the folder it serves (a file of its own: it imports mlserver).
RUNTIME = Path(__file__).resolve().parents[1] / "mlserver_runtime.py"
MLSERVER_VERSION = "1.7.1"
PACKAGES = [f"mlserver=={MLSERVER_VERSION}", "uvloop<0.22", "onnxruntime", "numpy"]


def ensure_mlserver(venv: Path = VENV) -> Path:
    """The `mlserver` executable, installing it into its own venv the first time."""
    exe = venv / "bin" / "mlserver"
    if exe.is_file():
        return exe
    print(f"installing MLServer {MLSERVER_VERSION} into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *PACKAGES], check=True)
    return exe


def mlserver_version(venv: Path = VENV) -> str:
    """The installed MLServer version."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mlserver; print(mlserver.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def mlserver_repository(
    root: Path,
    source: Path,
    models: list[BenchModel],
    http_port: int,
    grpc_port: int,
    metrics_port: int,
) -> Path:
    """A folder MLServer serves with `mlserver start`: settings, runtime, one folder per model."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copy(RUNTIME, root / "mlserver_runtime.py")
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    for model in models:
        folder = root / model.name
        folder.mkdir()
        shutil.copy(model.path(source), folder / "model.onnx")
        model_settings = {
            "name": model.name,
            "implementation": "mlserver_runtime.OnnxModel",
            "parameters": {
                "uri": "./model.onnx",
                "extra": {"intra_op_threads": model.intra_op_threads},
            },
            # Adaptive batching with the same knobs as dlscale's max_batch_size and queue delay.
            "max_batch_size": model.max_batch_size,
            "max_batch_time": model.max_queue_delay_us / 1e6,
        }
        (folder / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    return root


# -- Triton (nvidia-pytriton) ----------------------------------------------------------------------

PYTRITON_VENV = Path(".bench/pytriton-venv")
PYTRITON_VERSION = "0.7.0"
#: pytriton 0.7.0 ships tritonserver 2.51 and needs numpy 1 (see peers.md in the reference).
PYTRITON_PACKAGES = [f"nvidia-pytriton=={PYTRITON_VERSION}", "numpy<2", "onnxruntime"]


def ensure_pytriton(venv: Path = PYTRITON_VENV) -> Path:
    """The Python of a venv holding nvidia-pytriton (the real tritonserver), installed once."""
    python = venv / "bin" / "python"
    if python.is_file():
        return python
    print(f"installing nvidia-pytriton {PYTRITON_VERSION} into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PYTRITON_PACKAGES], check=True)
    return python


def pytriton_env(python: Path) -> dict[str, str]:
    """LD_LIBRARY_PATH with the venv interpreter's libpython first: Triton's Python-backend stub
    otherwise may load another Python's library and fail (shared/reference/peers.md)."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    libdir = out.stdout.strip()
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": f"{libdir}:{previous}" if previous else libdir}


#: What the JPEG pipeline's callable needs beside PyTriton: the image step's decoders.
PYTRITON_E2E_PACKAGES = ["simplejpeg>=1.7", "pillow>=10"]


def ensure_pytriton_e2e(venv: Path = PYTRITON_VENV) -> Path:
    """PyTriton's venv with the decoders the JPEG pipeline's callable uses, installed once."""
    python = ensure_pytriton(venv)
    probe = subprocess.run([str(python), "-c", "import simplejpeg, PIL"], capture_output=True)
    if probe.returncode != 0:
        print(f"installing {', '.join(PYTRITON_E2E_PACKAGES)} into {venv} (once)", flush=True)
        pip = [str(python), "-m", "pip", "install", "-q", *PYTRITON_E2E_PACKAGES]
        subprocess.run(pip, check=True)
    return python
