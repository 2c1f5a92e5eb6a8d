"""The codec's bounds on a tensor's shape, checked before any array is made (numpy-free, so the
command line can show them)."""

from __future__ import annotations

import math

from dlscale.errors import InvalidInput, clipped

#: numpy's most dimensions (NPY_MAXDIMS): a shape with more is refused before any array is made.
MAX_DIMS = 64
#: The most elements one tensor may declare unless the server says otherwise
#: (Limits.max_tensor_elements): 64 Mi, a 64 MiB body of one-byte elements.
MAX_ELEMENTS = 2**26
#: The most characters of a request's `id`: it is echoed in every answer, every event of a
#: stream among them, so a long one would multiply what the server writes and holds.
MAX_ID_CHARS = 256


def check_shape(
    role: str, name: str, shape: tuple[int, ...], max_elements: int = MAX_ELEMENTS
) -> int:
    """InvalidInput unless the shape has at most MAX_DIMS dimensions, none negative, and declares
    at most `max_elements` elements (each dimension too, so that a zero cannot hide a huge one);
    the elements it declares."""
    if len(shape) > MAX_DIMS:
        raise InvalidInput(
            f"{role} {name!r} has {len(shape)} dimensions; at most {MAX_DIMS} are allowed"
        )
    # min and max, not a generator over the dimensions, and without their `default` keyword
    # (parsed on every call): every tensor of every request is checked, most of them twice.
    if shape and min(shape) < 0:
        shown = clipped(str(list(shape)), 80)
        raise InvalidInput(f"{role} {name!r} has shape {shown}: dimensions must be >= 0")
    count = math.prod(shape)
    if (shape and max(shape) > max_elements) or count > max_elements:
        shown = clipped(str(list(shape)), 80)
        raise InvalidInput(
            f"{role} {name!r} has shape {shown}, more than the {max_elements} elements a "
            "tensor may hold on this server (max_tensor_elements)"
        )
    return count


def check_id(ident: str) -> None:
    """InvalidInput when a request's id is longer than MAX_ID_CHARS characters."""
    if len(ident) > MAX_ID_CHARS:
        raise InvalidInput(
            f"the request id is {len(ident)} characters, above the limit of {MAX_ID_CHARS}"
        )
