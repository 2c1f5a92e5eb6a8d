"""The Plane is declared once: its Protocol, the host's planes, the worker proxy, its owner agree.

The worker channel tests run a real owner (`PlaneHost` over a `HostPlane` of null models) and a
real `RemotePlane` over socket pairs in one event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model

from dlscale.errors import DlscaleError
from dlscale.frontends.plane import (
    METHODS,
    PLANE_METHODS,
    REGISTRY_METHODS,
    Asked,
    Plane,
    PlaneMethod,
)
from dlscale.frontends.workers import messages as ipc
from dlscale.frontends.workers.host import CALLS, PlaneHost
from dlscale.frontends.workers.remote import Calls, RemotePlane
from dlscale.serving.control.plane import ControlPlane
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.wire import channel
from dlscale.wire.segments import Segments

TENSORS = """
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [4]
"""


def _kind(value: object) -> str:
    """How a method answers: "awaited", "stream" (an async iterator) or "call"."""
    if inspect.iscoroutinefunction(value):
        return "awaited"
    if inspect.isasyncgenfunction(value):
        return "stream"
    hints = getattr(value, "__annotations__", {})
    return "stream" if "AsyncIterator" in str(hints.get("return", "")) else "call"


def _declared(method: PlaneMethod) -> str:
    return "stream" if method.stream else "awaited" if method.asynchronous else "call"


def _methods(cls: type) -> dict[str, str]:
    """Public callables of a class, each with how it answers."""
    return {
        name: _kind(value)
        for name, value in inspect.getmembers(cls, callable)
        if not name.startswith("_")
    }


def _implements(cls: type, room: str | None = None) -> None:
    found = _methods(cls)
    for method in PLANE_METHODS:
        if room is not None and method.room != room:
            continue
        assert method.name in found, f"{cls.__name__} lacks Plane method {method.name}"
        assert found[method.name] == _declared(method), f"{cls.__name__}.{method.name}"


def test_the_protocol_is_the_declaration() -> None:
    declared = {m.name: _declared(m) for m in PLANE_METHODS}
    assert _methods(Plane) == declared


def test_each_room_implements_its_methods_and_the_host_plane_all() -> None:
    _implements(DataPlane, "data")
    _implements(ControlPlane, "control")
    _implements(HostPlane)


def test_the_worker_proxy_forwards_every_declared_method() -> None:
    _implements(RemotePlane)


def test_the_frontends_view_awaits_every_method_but_the_local_one(tmp_path: Path) -> None:
    view = Asked(HostPlane(ModelManager.open(tmp_path)))
    for method in PLANE_METHODS:
        found = getattr(view, method.name)
        if not method.forwarded:  # answered in the caller's own process
            assert _kind(found) == "call", method.name
        elif method.stream:
            assert _kind(found) == "stream", method.name
        else:
            assert inspect.iscoroutinefunction(found), f"the view does not await {method.name}"
    public = {n for n in dir(view) if not n.startswith("_")}
    assert public - set(METHODS) == {"owner", "plane", "remote", "shared_memory"}


def test_the_owner_whitelist_is_derived_from_the_declaration() -> None:
    registry = {f"registry.{n}" for n in REGISTRY_METHODS}
    synchronous = {m.name for m in PLANE_METHODS if not m.asynchronous and not m.stream}
    assert registry | synchronous == CALLS


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[tuple[RemotePlane, socket.socket, HostPlane]]:
    """A worker's proxy and its owner over real socket pairs, both on this event loop."""
    write_null_model(tmp_path, "echo", "max_batch_size = 8\n" + TENSORS)
    manager = ModelManager.open(tmp_path)
    plane = HostPlane(manager, "explicit")
    await plane.load_initial()
    calls_worker, calls_owner = socket.socketpair()
    requests_worker, requests_owner = socket.socketpair()
    host = PlaneHost(plane)
    served = asyncio.get_running_loop().create_task(host.serve(calls_owner, requests_owner))
    segments = Segments(f"dlscale-test-plane.{os.getpid()}.")
    remote = RemotePlane(Calls(calls_worker), segments, False, 8)
    # A blocking call from this loop can never be answered: fail, rather than hang, if one is made.
    calls_worker.settimeout(10)
    await remote.connect(requests_worker)
    yield remote, calls_worker, plane
    await remote.close()
    served.cancel()
    segments.close()
    await manager.close()


async def test_synchronous_methods_are_awaited_over_the_asynchronous_channel(
    linked: tuple[RemotePlane, socket.socket, HostPlane],
) -> None:
    remote, _, _ = linked
    # The owner answers on this same loop: a blocking call from here would never be answered,
    # so an answer proves that the loop was free while it waited.
    plane = Asked(remote.as_plane())
    assert plane.remote
    meta = await asyncio.wait_for(plane.model_metadata("echo"), 30)
    assert meta.name == "echo"
    assert await asyncio.wait_for(plane.ready(), 30)
    assert [s.name for s in await plane.statistics("echo")] == ["echo"]
    with pytest.raises(DlscaleError, match="unknown model"):
        await plane.model_config("ghost")


async def test_the_owner_refuses_a_method_the_plane_does_not_declare(
    linked: tuple[RemotePlane, socket.socket, HostPlane],
) -> None:
    remote, _, plane = linked
    assert "stop_accepting" not in METHODS
    ident = 99
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    remote._pending[ident] = future
    assert remote._writer is not None
    # A worker that asks the owner to stop serving: refused, and the owner keeps serving.
    remote._writer.writelines(channel.encode(ipc.PlaneCall("stop_accepting", (), {}, ident)))
    with pytest.raises(DlscaleError, match="a worker asked for 'stop_accepting'"):
        await asyncio.wait_for(future, 30)
    assert await plane.ready()


async def test_the_owner_refuses_a_registry_operation_not_declared(
    linked: tuple[RemotePlane, socket.socket, HostPlane],
) -> None:
    _, calls_worker, _ = linked
    # `close` would unmap every client's region: not a registry operation a worker may call.
    calls = channel.encode(ipc.PlaneCall("registry.close"))
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(calls_worker, b"".join(calls))
    reply = await loop.run_in_executor(None, channel.read_blocking, calls_worker)
    assert isinstance(reply, ipc.Reply) and not reply.ok
    assert "registry.close" in str(reply.value)


async def test_a_bare_tuple_breaks_the_channel(
    linked: tuple[RemotePlane, socket.socket, HostPlane],
) -> None:
    remote, _, _ = linked
    assert remote._writer is not None
    remote._writer.writelines(channel.encode(("infer", ())))
    await asyncio.wait_for(remote.gone.wait(), 30)  # the owner hung up on the untyped message
