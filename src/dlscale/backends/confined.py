"""Reading a file a model's config names: inside the model's folder, regular, bounded.

A config may come from a client (a load request's override), so every file it names is read
through here: a path that leaves the folder (`..`, a link out of it), a FIFO that would block the
server until a writer comes, or a file larger than the limit is refused with a ConfigError.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from dlscale.errors import ConfigError


def read_confined(folder: Path, name: str, limit: int, what: str) -> bytes:
    """The bytes of `folder`/`name`, at most `limit`; `what` names the file in errors."""
    path = folder / name
    try:
        if not path.resolve().is_relative_to(folder.resolve()):
            raise _unreadable(what, name, "it must be a file inside the model's folder")
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise _unreadable(what, name, "not a regular file")
            data = file.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise _unreadable(what, name, getattr(exc, "strerror", None) or str(exc)) from None
    if len(data) > limit:
        raise _unreadable(what, name, f"larger than the limit of {limit} bytes")
    return data


def _unreadable(what: str, name: str, why: str) -> ConfigError:
    return ConfigError(f"the {what} cannot be read ({name!r}): {why}")


def external_data_outside(model: bytes) -> list[str]:
    """The external-data locations an ONNX model names that would leave its folder.

    ONNX Runtime reads an initializer's `location` relative to the model file; a location that
    is absolute or climbs out (`..`) would make an uploaded model read the host's files.
    """
    import onnx

    try:
        proto = onnx.load_model_from_string(model)  # from bytes: external data stays unread
    except Exception as exc:  # protobuf's DecodeError and onnx's own: not an ONNX model
        raise ConfigError(f"not an ONNX model: {exc}") from None
    graphs = [proto.graph, *(f for f in proto.functions)]
    outside = []
    for tensor in onnx_tensors(graphs):
        for entry in tensor.external_data:
            location = entry.value.replace("\\", "/")
            if entry.key == "location" and (
                location.startswith("/") or ":" in location or ".." in PurePosixPath(location).parts
            ):
                outside.append(entry.value)
    return outside


def onnx_tensors(graphs: list[Any]) -> Iterator[Any]:
    """Every TensorProto of ONNX graphs (or functions): initializers and node attributes, nested."""
    while graphs:
        graph = graphs.pop()
        yield from getattr(graph, "initializer", ())
        for sparse in getattr(graph, "sparse_initializer", ()):
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            for attribute in node.attribute:
                yield from (attribute.t, *attribute.tensors)
                graphs.extend(attribute.graphs)
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
