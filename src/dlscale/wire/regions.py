"""Triton's shared-memory parameters on a tensor: which region holds its data, and where.

A tensor whose parameters name a region carries no data in the body or message; `region_of`
reads those parameters into a typed reference and `region_parameters` writes them. The bytes
found in the region are read by `tensors.read_tensor` like any raw data (REGION_WORDS there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlscale.errors import InvalidInput
from dlscale.types import Parameters, RegionRef

#: The parameter naming the region.
REGION = "shared_memory_region"
#: The parameter giving how many bytes of the region the tensor takes.
REGION_BYTE_SIZE = "shared_memory_byte_size"
#: Where in the region the tensor starts (0 when absent).
REGION_OFFSET = "shared_memory_offset"
#: The parameters that place a tensor in a region; a tensor without any of them names none.
REGION_KEYS = frozenset((REGION, REGION_BYTE_SIZE, REGION_OFFSET))


def region_of(role: str, name: str, params: Mapping[str, Any]) -> RegionRef | None:
    """The region a tensor's parameters place its data in, or None when they name none.

    `shared_memory_region` and `shared_memory_byte_size` go together; `shared_memory_offset`
    defaults to 0. Whether the region exists and holds those bytes is the registry's to say.
    """
    region = params.get(REGION)
    if region is None:
        if REGION_BYTE_SIZE not in params and REGION_OFFSET not in params:
            return None  # the common case, without the list below
        stray = [k for k in (REGION_BYTE_SIZE, REGION_OFFSET) if k in params]
        raise InvalidInput(f"{role} {name!r} gives {stray} without {REGION!r}")
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{role} {name!r}: {REGION!r} must be a region name, got {region!r}")
    if REGION_BYTE_SIZE not in params:
        raise InvalidInput(
            f"{role} {name!r} gives {REGION!r} but no {REGION_BYTE_SIZE!r}: both are required"
        )
    size, offset = params[REGION_BYTE_SIZE], params.get(REGION_OFFSET, 0)
    for key, value in ((REGION_BYTE_SIZE, size), (REGION_OFFSET, offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"{role} {name!r}: {key!r} must be a non-negative integer, got {value!r}"
            )
    return RegionRef(region, size, offset)


def region_parameters(ref: RegionRef) -> Parameters:
    """The parameters that place a tensor's data in a region (the offset only when not 0)."""
    params: Parameters = {REGION: ref.region, REGION_BYTE_SIZE: ref.byte_size}
    if ref.offset:
        params[REGION_OFFSET] = ref.offset
    return params
