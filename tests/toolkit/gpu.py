"""Why a GPU test cannot run here, said exactly: no GPU, or a GPU but a CPU-only build of the
runtime it needs (the project's .venv pins the CPU build of torch); docs/testing.md."""

from __future__ import annotations

import functools

from dlscale.hardware.detect import HostInfo, detect

#: What to run instead, named in every skip reason that a GPU machine can act on.
RUN_THERE = "run `make test-gpu` there, with the machine's CUDA builds (docs/testing.md)"


@functools.cache
def host() -> HostInfo:
    """This machine's CPU and the GPUs NVML sees (once per session)."""
    return detect()


def gpus_seen() -> str:
    """How many GPUs NVML sees, or why it sees none, in words."""
    found = host()
    if found.gpus:
        return f"NVML sees {len(found.gpus)} GPU(s): {', '.join(g.name for g in found.gpus)}"
    return f"no GPU here (NVML {found.nvml})"


def torch_cuda_missing() -> str | None:
    """None when torch can run on a CUDA GPU here; else what is missing."""
    try:
        import torch
    except ModuleNotFoundError:
        return "needs torch (the [torch] extra)"
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        build = f"torch {torch.__version__} is a CPU-only build"
        if host().gpus:
            return f"{gpus_seen()}, but {build}: {RUN_THERE}"
        return f"{gpus_seen()}, and {build}"
    return f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but {gpus_seen()}"


def onnxruntime_cuda_missing() -> str | None:
    """None when onnxruntime has its CUDA provider and a GPU to run it on; else what is missing."""
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        build = f"onnxruntime {onnxruntime.__version__} has no CUDA provider ({providers})"
        if host().gpus:
            return f"{gpus_seen()}, but {build}: install onnxruntime-gpu and {RUN_THERE}"
        return f"{gpus_seen()}, and {build}"
    if not host().gpus:
        return f"onnxruntime has its CUDA provider, but {gpus_seen()}"
    return None
