"""PyTorch → ONNX with the TorchScript exporter, and deterministic files around it."""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    from torch import nn

OPSET = 17
BATCH_AXIS = "batch"
#: Every npz member gets this timestamp; zipfile would otherwise stamp the build time.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def export_onnx(
    module: nn.Module,
    example: Mapping[str, np.ndarray],
    output_names: Sequence[str],
) -> onnx.ModelProto:
    """Export `module` at opset 17 with dim 0 of every input and output named "batch".

    The TorchScript exporter (`dynamo=False`) is used: it writes opset 17 directly, takes well
    under a second for these models where the torch.export one takes tens, and gives the same
    bytes on every run. See docs/zoo.md.
    """
    import torch

    names = list(example)
    args = tuple(torch.from_numpy(example[name]) for name in names)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
        torch.onnx.export(
            module,
            args,
            buffer,  # type: ignore[arg-type]  # the TorchScript exporter takes a binary stream
            dynamo=False,
            input_names=names,
            output_names=list(output_names),
            dynamic_axes={name: {0: BATCH_AXIS} for name in [*names, *output_names]},
            opset_version=OPSET,
            do_constant_folding=True,
        )
    return onnx.load_from_string(buffer.getvalue())


def add_metadata(model: onnx.ModelProto, metadata: Mapping[str, str]) -> None:
    """Add `metadata` to the model's `metadata_props`, sorted by key."""
    for key, value in sorted(metadata.items()):
        model.metadata_props.add(key=key, value=value)


def save_onnx(model: onnx.ModelProto, path: Path) -> None:
    """Save and check with full shape inference, reading the file back (no in-memory copy)."""
    onnx.save_model(model, path)
    onnx.checker.check_model(path, full_check=True)


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """`np.savez` with fixed timestamps, so the same arrays always give the same bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            with archive.open(member, "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
