"""The shared-memory routes of the REST API (Triton's system and CUDA shared-memory extensions).

    GET  v2/{system,cuda}sharedmemory[/region/NAME]/status
    POST v2/{system,cuda}sharedmemory/region/NAME/register
    POST v2/{system,cuda}sharedmemory[/region/NAME]/unregister

All of them form one group (`PREFIXES`), so that an access rule can gate them together. Bodies
are decoded here; the registry (serving/regions/registry.py) does the rest.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from dlscale.serving.regions.registry import RegionKind, SharedMemoryRegistry
from dlscale.wire.rest_json import decode_json, from_base64
from dlscale.wire.tensors import Buffer

#: The first path segment after v2/ of each extension, and the kind of region it holds.
PREFIXES = {"systemsharedmemory": RegionKind.SYSTEM, "cudasharedmemory": RegionKind.CUDA}
_METHODS = {"status": "GET", "register": "POST", "unregister": "POST"}
_Size = Annotated[int, msgspec.Meta(ge=0)]


class _SystemRegister(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    byte_size: _Size
    offset: _Size = 0


class _Handle(msgspec.Struct):
    b64: str


class _CudaRegister(msgspec.Struct, forbid_unknown_fields=True):
    raw_handle: _Handle
    device_id: _Size
    byte_size: _Size


_SYSTEM = msgspec.json.Decoder(_SystemRegister)
_CUDA = msgspec.json.Decoder(_CudaRegister)


def route(prefix: str, tail: list[str]) -> tuple[list[str], str] | None:
    """The (kind, name, action) arguments and the method of a shared-memory path, or None."""
    match tail:
        case [action] if action in _METHODS and action != "register":
            return [PREFIXES[prefix].value, "", action], _METHODS[action]
        case ["region", name, action] if action in _METHODS:
            return [PREFIXES[prefix].value, name, action], _METHODS[action]
    return None


def handle(
    registry: SharedMemoryRegistry, kind_name: str, name: str, action: str, body: Buffer
) -> Any:
    """Answer one call: the status list, or None for a register or unregister done."""
    kind = RegionKind(kind_name)
    if action == "status":
        return [s.fields() for s in registry.status(kind, name)]
    if action == "unregister":
        registry.unregister(kind, name)
        return None
    if kind is RegionKind.SYSTEM:
        system = decode_json(_SYSTEM, body, "system shared-memory register request")
        registry.register_system(name, system.key, system.offset, system.byte_size)
    else:
        cuda = decode_json(_CUDA, body, "CUDA shared-memory register request")
        handle = from_base64(cuda.raw_handle.b64, "raw_handle.b64")
        registry.register_cuda(name, handle, cuda.device_id, cuda.byte_size)
    return None
