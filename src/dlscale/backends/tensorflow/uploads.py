"""Which uploaded TensorFlow files are data: checked on their bytes before any is written.

A SavedModel's graph may name ops that read or write the host's files or load custom-op
libraries (graphs.py); a `.keras` file's config may name a Lambda layer (marshalled Python) and
its HDF5 weights may point at other files (external links, external or virtual datasets), which
h5py would read. Each is refused with the reason; what passes is loaded with Keras's safe_mode.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

from dlscale.backends.tensorflow.graphs import check_known_ops, host_reaching_ops, parse
from dlscale.errors import ConfigError, InvalidInput, PermissionDenied

#: What a `.keras` archive holds (Keras 3's saving format); anything else is refused.
_KERAS_MEMBERS = ("config.json", "metadata.json", "model.weights.h5", "model.weights.npz")
#: Class names whose config carries Python code (Keras writes a Lambda's bytecode).
_CODE_CLASSES = {"Lambda", "__lambda__", "TorchModuleWrapper", "TFSMLayer"}


def check_upload(file_name: str, data: bytes) -> None:
    """PermissionDenied (or InvalidInput for a broken file) unless `data` is only data."""
    if file_name == "saved_model.pb":
        _check_saved_model(file_name, data)
    elif file_name.endswith(".keras"):
        _check_keras(file_name, data)


def _check_saved_model(file_name: str, data: bytes) -> None:
    try:
        message = parse(data, file_name)
        check_known_ops(message, file_name)
    except ConfigError as exc:
        raise InvalidInput(str(exc)) from None
    reaching = host_reaching_ops(message)
    if reaching:
        shown = reaching[:8] + ([f"... {len(reaching) - 8} more"] if len(reaching) > 8 else [])
        raise PermissionDenied(
            f"uploaded {file_name}: its graph reaches the host outside its tensors ({shown}): "
            "file, Python, network and debug ops come from the model repository only"
        )


def _check_keras(file_name: str, data: bytes) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
        config = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise InvalidInput(f"uploaded {file_name}: not a Keras 3 file: {exc}") from None
    strange = [n for n in names if n not in _KERAS_MEMBERS and not n.startswith("assets/")]
    if strange:
        raise PermissionDenied(f"uploaded {file_name}: unexpected members {strange[:8]}")
    code = sorted({c for c in _class_names(config) if c in _CODE_CLASSES})
    if code:
        raise PermissionDenied(
            f"uploaded {file_name}: its config holds {code}, whose loading runs Python; such "
            "models come from the model repository only"
        )
    if "model.weights.h5" in names:
        _check_h5(file_name, archive.read("model.weights.h5"))


def _class_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("class_name"), str):
            yield node["class_name"]
        for value in node.values():
            yield from _class_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from _class_names(value)


def _check_h5(file_name: str, data: bytes) -> None:
    """HDF5 can store a dataset in another file, or link to one: h5py would read the host's."""
    import h5py

    outside: list[str] = []

    def visit(name: str, link: Any) -> None:
        if isinstance(link, h5py.ExternalLink | h5py.SoftLink):
            outside.append(name)

    def visit_items(name: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset) and (item.external or item.is_virtual):
            outside.append(name)

    try:
        with h5py.File(io.BytesIO(data), "r") as weights:
            weights.visititems_links(visit)
            weights.visititems(visit_items)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"uploaded {file_name}: its weights are not HDF5: {exc}") from None
    if outside:
        raise PermissionDenied(
            f"uploaded {file_name}: weights {outside[:8]} are stored in or linked to other "
            "files; an uploaded model holds its weights itself"
        )
