"""HTTP/1.1 answers as bytes for the socket, and the requests a connection holds until then.

The connection (connection.py) parses and orders; this module only frames: a status line, the
headers, the body parts, in one buffer when small (one write, one syscall) and as the parts
themselves when large (no copy of a large body).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from dlscale.frontends.rest.api import RestResponse, error_response
from dlscale.wire.tensors import Buffer

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
#: Answers shorter than this go out joined with their head, in one write.
_JOIN_BELOW = 65536


@dataclass(eq=False, slots=True)  # one per request: slots make it and read it faster
class Pending:
    """One parsed request waiting for its turn, or a refusal to send before closing."""

    method: str
    path: str
    headers: dict[str, str]
    body: Buffer
    keep_alive: bool
    refusal: RestResponse | None = None
    answer: RestResponse | None = None  # known before the body was read: sent, kept alive


def frame(response: RestResponse, keep_alive: bool, head_only: bool = False) -> list[Buffer]:
    """The bytes of `response`: one buffer when small, else its head and then its parts."""
    parts = response.parts
    size = sum(map(len, parts))  # no generator: once per answer
    start = _STARTS.get((response.status, response.content_type))
    if start is None:
        start = _start(response.status, response.content_type)
    head: list[Buffer] = [start, b"%d\r\n" % size]
    for pair in response.headers:
        head.append(_LINES.get(pair) or _line(pair))
    head.append(b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
    if head_only:  # a HEAD answer has headers and no body
        return [b"".join(head)]
    if size < _JOIN_BELOW:
        head += parts
        return [b"".join(head)]
    return [b"".join(head), *parts]


#: The head's first lines up to the length's digits, by status and content type: made once
#: each (a few kinds of answer), not formatted and encoded per answer.
_STARTS: dict[tuple[int, str], bytes] = {}
_MOST_STARTS = 256


def _start(status: int, content_type: str) -> bytes:
    """A start not made before: made, and kept while the cache has room."""
    start = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: " % (
        status,
        _REASONS.get(status, b""),
        content_type.encode(),
    )
    if len(_STARTS) < _MOST_STARTS:  # a bound, should any content type come from a client
        _STARTS[(status, content_type)] = start
    return start


#: Header lines made before, by name and value: most answers repeat a few (a binary answer's
#: JSON length); bounded, as values can come from what clients send.
_LINES: dict[tuple[str, str], bytes] = {}
_MOST_LINES = 1024


def _line(pair: tuple[str, str]) -> bytes:
    line = f"{pair[0]}: {pair[1]}\r\n".encode("latin-1")
    if len(_LINES) < _MOST_LINES:
        _LINES[pair] = line
    return line


def cut_response(grace_s: float) -> RestResponse:
    """The 503 of a request still running when the server's grace ran out."""
    return error_response(
        503, f"the server stopped before this request finished, after a grace of {grace_s:g} s"
    )
