"""The precision a served model computes in, read from its file and config."""

from __future__ import annotations

from pathlib import Path

from dlscale.errors import DlscaleError
from dlscale.models.config import load_config


def precision_of(model_file: Path | None) -> str:
    """The precision the model computes in: a torch model's setting or package, else FP32.

    ONNX files are taken as FP32 (the reference precision); a torch model says its own in
    config.toml's [backend_options] or, for an AOTInductor package, in the package.
    """
    if model_file is None or model_file.suffix == ".onnx":
        return "fp32"
    try:
        if model_file.name.endswith(".aoti.pt2"):
            from dlscale.backends.torch.aoti import read_info

            return read_info(model_file).precision
        config = load_config(
            model_file.parent.parent / "config.toml", model_file.parent.parent.name
        )
    except (DlscaleError, OSError):
        return "fp32"
    return str((config.backend_options.model_extra or {}).get("precision", "fp32"))
