"""Importing dlscale, its server and its CLI imports no TensorFlow: only a TF model's load does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from dlscale.backends import RUNTIMES, uploadable


def test_importing_dlscale_does_not_import_tensorflow() -> None:
    code = (
        "import sys, dlscale, dlscale.server, dlscale.cli, dlscale.backends, "
        "dlscale.serving.control.uploads, dlscale.optimize.search, dlscale.plan.allreduce_bench\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_tensorflow_uploads_are_named_data_files_only() -> None:
    runtime = RUNTIMES["tensorflow"]
    assert runtime.triton_names == ("tensorflow_savedmodel", "tensorflow")
    for name in ("saved_model.pb", "variables.index", "variables.data-00000-of-00001", "m.keras"):
        assert uploadable("tensorflow", name), name
    for name in ("_ops.so", "model.py", "keras_metadata.pb.py", "saved_model.pbtxt", "x.h5"):
        assert not uploadable("tensorflow", name), name


@pytest.mark.parametrize(
    "loads_tensorflow",
    [
        "import dlscale.backends.tensorflow",
        # TensorFlow Serving's gRPC stubs load TensorFlow too (--grpc-tfserving).
        "from dlscale.frontends.grpc.tfserving import services; assert services()",
    ],
)
def test_torch_compile_after_tensorflow_is_loaded_does_not_abort(loads_tensorflow: str) -> None:
    # Both bundle LLVM: TensorFlow loaded before Triton aborted the process (issue 38).
    # Looked up, not imported: importing TensorFlow here would set up the very abort.
    for module in ("tensorflow", "tensorflow_serving", "triton"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    # triton.runtime loads Triton's LLVM, as torch.compile's inductor does (the abort needs no
    # more: `import tensorflow; import triton.runtime` aborts; inductor's import adds 6 s).
    code = f"{loads_tensorflow}; import triton.runtime; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
