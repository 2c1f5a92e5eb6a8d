"""The fleet's control endpoint: a model's load or unload reaches every replica, and is kept.

HAProxy sends the repository API's load and unload (REST `/v2/repository/models/NAME/load`,
gRPC `RepositoryModelLoad`/`RepositoryModelUnload`) here instead of to one replica
(haproxy_config.Control). Each is recorded first (the latest per model, in order: the wanted set),
then sent as it came to every replica that joined; the client gets the first refusal, or the
first answer when all accepted. A replica that starts later replays the recorded requests on
its own child before it takes requests (scale/fleet.py), so every replica serves the same
models. A request that no replica accepted is forgotten again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from dlscale.scale.child import Endpoint
from dlscale.scale.haproxy_config import CONTROL_RPCS, GRPC, REST
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

log = logging.getLogger("dlscale.scale")
#: Seconds a replica gets to load or unload a model (a large model loads for minutes).
APPLY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Entry:
    """One load or unload as the client sent it, to be sent again to a new replica."""

    seq: int
    model: str
    proto: str
    #: The REST path, or the gRPC method's full name.
    path: str
    body: bytes
    content_type: str = "application/json"


class ControlLog:
    """The latest load or unload of each model, in the order they came (thread-safe)."""

    def __init__(self) -> None:
        self._latest: dict[str, Entry] = {}
        self.seq = 0
        self._lock = threading.Lock()

    def record(
        self, model: str, proto: str, path: str, body: bytes, ctype: str
    ) -> tuple[Entry, Entry | None]:
        """Keep a request as the model's latest; returns it and the model's latest before it
        (to `forget` it if all refuse)."""
        with self._lock:
            self.seq += 1
            entry = Entry(self.seq, model, proto, path, body, ctype)
            previous = self._latest.get(model)
            self._latest[model] = entry
            return entry, previous

    def forget(self, entry: Entry, previous: Entry | None) -> None:
        """Undo `record` (no replica accepted it), unless a later request came meanwhile."""
        with self._lock:
            if self._latest.get(entry.model) is entry:
                if previous is None:
                    del self._latest[entry.model]
                else:
                    self._latest[entry.model] = previous

    def entries(self) -> list[Entry]:
        """Every model's latest request, oldest first (the order to replay them)."""
        with self._lock:
            return sorted(self._latest.values(), key=lambda e: e.seq)

    def adopt(self, entries: Sequence[Entry]) -> bool:
        """Take a replica's copy when it is newer than ours (the router restarted empty)."""
        with self._lock:
            newest = max((e.seq for e in entries), default=0)
            if newest <= self.seq:
                return False
            self._latest = {e.model: e for e in entries}
            self.seq = newest
            return True

    def wanted(self) -> dict[str, str]:
        """Each model and whether it was last loaded or unloaded."""
        return {e.model: _verb(e.path) for e in self.entries()}


def _verb(path: str) -> str:
    return "unload" if path.endswith(("/unload", "Unload")) else "load"


@dataclass(frozen=True)
class Answer:
    """A replica's answer: an HTTP status, or a gRPC code (OK = 0), its body or details."""

    ok: bool
    status: int
    body: bytes
    content_type: str = "application/json"


async def send(entry: Entry, endpoint: Endpoint, client: httpx.AsyncClient) -> Answer:
    """Send one recorded request to one replica's child, as the client sent it."""
    try:
        if entry.proto == REST:
            return await _send_rest(entry, endpoint, client)
        return await _send_grpc(entry, endpoint)
    except (httpx.HTTPError, OSError) as exc:
        body = f'{{"error": "replica {endpoint.host}:{endpoint.http_port} did not answer: {exc}"}}'
        return Answer(False, 503, body.encode())


async def _send_rest(entry: Entry, endpoint: Endpoint, client: httpx.AsyncClient) -> Answer:
    url = f"http://{endpoint.host}:{endpoint.http_port}{entry.path}"
    headers = {"content-type": entry.content_type}
    r = await client.post(url, content=entry.body, headers=headers, timeout=APPLY_TIMEOUT_S)
    ctype = r.headers.get("content-type", "application/json")
    return Answer(r.is_success, r.status_code, r.content, ctype)


async def _send_grpc(entry: Entry, endpoint: Endpoint) -> Answer:
    if endpoint.grpc_port is None:
        return Answer(False, grpc.StatusCode.UNAVAILABLE.value[0], b"the replica has no gRPC port")
    async with grpc.aio.insecure_channel(f"{endpoint.host}:{endpoint.grpc_port}") as channel:
        call = channel.unary_unary(entry.path)  # bytes in, bytes out: sent as it came
        try:
            reply = await call(entry.body, timeout=APPLY_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return Answer(False, exc.code().value[0], (exc.details() or "").encode())
    return Answer(True, 0, bytes(reply))


async def fan_out(
    log_: ControlLog, entry: Entry, previous: Entry | None, endpoints: Sequence[Endpoint]
) -> Answer:
    """Send a just-recorded request to every replica; the first refusal, or the first answer."""
    if not endpoints:
        log_.forget(entry, previous)
        return _no_replica(entry.proto)
    async with httpx.AsyncClient() as client:
        answers = await asyncio.gather(*(send(entry, e, client) for e in endpoints))
    if not any(a.ok for a in answers):
        log_.forget(entry, previous)
    refused = [a for a in answers if not a.ok]
    log.info(
        "%s of %s: %d replica(s) accepted, %d refused",
        _verb(entry.path), entry.model, len(answers) - len(refused), len(refused),
    )  # fmt: skip
    return refused[0] if refused else answers[0]


def _no_replica(proto: str) -> Answer:
    why = "no replica is up to load or unload on: retry"
    if proto == GRPC:
        return Answer(False, grpc.StatusCode.UNAVAILABLE.value[0], why.encode())
    return Answer(False, 503, f'{{"error": "{why}"}}'.encode())


async def replay(entries: Sequence[Entry], endpoint: Endpoint, read_up_to: int = 0) -> list[str]:
    """Send every recorded request to a new replica's child, in order; what failed, in words.

    A plain load recorded at or before `read_up_to` (the log's last when the child began to
    start) of a model the child's start loaded is left out: the child read the repository after
    it, so the load would only do again what the start did, and double the replica's start."""
    failed = []
    async with httpx.AsyncClient() as client:
        loaded = await _ready_models(endpoint, client) if read_up_to else set()
        for entry in entries:
            if entry.seq <= read_up_to and entry.model in loaded and _plain_load(entry):
                continue
            answer = await send(entry, endpoint, client)
            if not answer.ok:
                failed.append(f"{_verb(entry.path)} {entry.model}: {answer.body[:200]!r}")
    return failed


async def _ready_models(endpoint: Endpoint, client: httpx.AsyncClient) -> set[str]:
    """The models a child serves (none when it does not say: then every load is replayed)."""
    url = f"http://{endpoint.host}:{endpoint.http_port}/v2/repository/index"
    try:
        r = await client.post(url, json={"ready": True}, timeout=APPLY_TIMEOUT_S)
        r.raise_for_status()
        return {str(m["name"]) for m in r.json() if m.get("state") == "READY"}
    except (httpx.HTTPError, ValueError, TypeError, KeyError):
        return set()


def _plain_load(entry: Entry) -> bool:
    """A load that names no parameters (no config, no files): it reads the repository as is."""
    if _verb(entry.path) != "load":
        return False
    if entry.proto == GRPC:
        request = pb.RepositoryModelLoadRequest.FromString(entry.body)
        return not request.parameters and not request.repository_name
    try:
        body = json.loads(entry.body or b"{}")
    except ValueError:
        return False
    return isinstance(body, dict) and not body.get("parameters")


def grpc_model(method: str, body: bytes) -> str:
    """The model a RepositoryModelLoad or -Unload request names."""
    load = _verb(method) == "load"
    kind = pb.RepositoryModelLoadRequest if load else pb.RepositoryModelUnloadRequest
    return str(kind.FromString(body).model_name)


#: A control request as the server hands it over: (proto, path, body, content type) -> Answer.
Handler = Callable[[str, str, bytes, str], Awaitable[Answer]]


def grpc_handler(handle: Handler) -> grpc.GenericRpcHandler:
    """The two RPCs, bytes in and out, given to `handle`; a refusal becomes the call's status."""

    def method(name: str) -> grpc.RpcMethodHandler:
        async def call(body: bytes, context: Any) -> bytes:
            answer = await handle(GRPC, name, body, "application/grpc")
            if not answer.ok:
                code = next(c for c in grpc.StatusCode if c.value[0] == answer.status)
                await context.abort(code, answer.body.decode(errors="replace"))
            return answer.body

        return grpc.unary_unary_rpc_method_handler(call)

    methods = {path.rpartition("/")[2]: method(path) for path in CONTROL_RPCS}
    return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods)
