"""The shared-memory registry: regions clients register, opened once, leased by requests.

System regions are clients' POSIX shared-memory objects (serving/regions/system.py: refused when
reserved for the server, of another user or with several names; copied in and out, never
mapped), CUDA regions are cudaIpcMemHandles (serving/regions/cuda.py); both share one namespace
of names, as in Triton.
Every offset and size a request names is checked here, once, against the region. A request
holds a `Lease` on the regions it uses until the batcher and the DataPlane are both done with
them. Unregistering a region that a queued or running request uses is deferred: the region
stays listed, takes no new requests, and is released when its last lease ends (Triton does the
same since 2.52), so no request ever reads or writes memory that was released under it.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dlscale.errors import InvalidInput, NotFound, Unavailable, Unsupported
from dlscale.serving.regions import MAX_REGIONS
from dlscale.serving.regions import cuda as cuda_memory
from dlscale.serving.regions.cuda import DeviceRegion
from dlscale.serving.regions.system import ClientObject, Identity, check_name
from dlscale.types import Datatype, RegionRef, RegionTensor
from dlscale.wire import segments
from dlscale.wire.tensors import (
    REGION_WORDS,
    Form,
    RawData,
    WireTensor,
    check_raw_size,
    read_tensor,
    write_tensor,
)

log = logging.getLogger("dlscale.shm")

#: What a client is told when the server was started without --allow-client-shm (Triton's).
DISABLED = (
    "client shared memory is disabled: start the server with --allow-client-shm to register regions"
)


class RegionKind(enum.StrEnum):
    """The two extensions: system (POSIX) and CUDA shared memory."""

    SYSTEM = "system"
    CUDA = "cuda"


@dataclass(frozen=True)
class RegionStatus:
    """One registered region as the status APIs list it (key and offset: system regions)."""

    name: str
    kind: RegionKind
    byte_size: int
    key: str = ""
    offset: int = 0
    device_id: int = 0

    def fields(self) -> dict[str, Any]:
        """The fields Triton's status lists for a region of this kind, REST's and gRPC's alike."""
        if self.kind is RegionKind.SYSTEM:
            return {
                "name": self.name,
                "key": self.key,
                "offset": self.offset,
                "byte_size": self.byte_size,
            }
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


@dataclass(eq=False)
class _Region:
    status: RegionStatus
    memory: ClientObject | DeviceRegion
    users: int = 0
    retiring: bool = False  # unregistered while in use: released when the last user leaves


class Descriptors(Protocol):
    """The process's budget of file descriptors (frontends/limits.py: DescriptorBudget)."""

    def acquire(self) -> bool:
        """Take one descriptor; False when none is left (after closing idle connections)."""
        ...

    def release(self) -> None:
        """Give one back."""
        ...


class SharedMemoryRegistry:
    """The regions of one server; off (every register refused) unless `enabled`.

    `owners`: users besides the server's own whose objects may be registered (none by default).
    """

    def __init__(
        self,
        enabled: bool = False,
        max_regions: int = MAX_REGIONS,
        owners: frozenset[int] = frozenset(),
        descriptors: Descriptors | None = None,
    ):
        if max_regions < 1:
            raise ValueError(f"max_regions must be at least 1, got {max_regions}")
        self.enabled = enabled
        self.max_regions = max_regions
        #: The users whose objects may be registered.
        self.owners = owners | {os.geteuid()}
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        #: The process's file descriptors, shared with the frontends' connections: a system
        #: region holds one open while it is registered.
        self.descriptors = descriptors

    @property
    def cuda_ready(self) -> bool:
        """Whether CUDA regions can be registered here (a device and CuPy)."""
        return self.enabled and cuda_memory.device_count() > 0

    # -- registration ------------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register `byte_size` bytes at `offset` of the client's object `key` as `name`."""
        self._check_new(name)
        _check_sizes(offset, byte_size)
        if self.descriptors is not None and not self.descriptors.acquire():
            raise Unavailable(
                "the server has no file descriptor left for another shared-memory region; "
                "unregister some, or try again when connections have closed"
            )
        try:
            memory = ClientObject(key, offset, byte_size, segments.OWN, self.owners)
        except BaseException:
            self._give_back(RegionKind.SYSTEM)
            raise
        status = RegionStatus(name, RegionKind.SYSTEM, byte_size, key=key, offset=offset)
        self._add(_Region(status, memory))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the client's device memory of a cudaIpcMemHandle as `name`."""
        self._check_new(name)
        _check_sizes(0, byte_size)
        memory = DeviceRegion(raw_handle, device_id, byte_size)
        status = RegionStatus(name, RegionKind.CUDA, byte_size, device_id=device_id)
        self._add(_Region(status, memory))

    def reserve(self, identity: Identity) -> None:
        """Declare a shared-memory object the server made (device, inode): never a region.

        Kept in the process's one record (wire/segments.py: OWN), which the Python backend's
        worker segments join too, so that every server object is refused, by any transport."""
        segments.OWN.add(identity)

    def unreserve(self, identity: Identity) -> None:
        """The server is done with an object it reserved (its inode may be reused)."""
        segments.OWN.discard(identity)

    def _check_new(self, name: str) -> None:
        if not self.enabled:
            raise Unsupported(DISABLED)
        check_name(name)
        with self._lock:
            existing = self._regions.get(name)
            if existing is not None:
                state = "is being unregistered" if existing.retiring else "is already registered"
                raise InvalidInput(
                    f"shared-memory region {name!r} {state} (as {existing.status.kind.value} "
                    "shared memory); unregister it first"
                )
            if len(self._regions) >= self.max_regions:
                raise InvalidInput(
                    f"the server holds its maximum of {self.max_regions} shared-memory regions "
                    "(--max-shm-regions); unregister some first"
                )

    def _add(self, region: _Region) -> None:
        with self._lock:
            if region.status.name in self._regions or len(self._regions) >= self.max_regions:
                self._release(region)  # another registration won the race
                raise InvalidInput(f"shared-memory region {region.status.name!r} is taken")
            self._regions[region.status.name] = region
        log.info("registered %s", region.status)

    # -- status and unregistration -----------------------------------------------------------------

    def status(self, kind: RegionKind, name: str = "") -> list[RegionStatus]:
        """The regions of one kind, or the one named (NotFound when it is not of that kind)."""
        with self._lock:
            if not name:
                return [r.status for r in self._regions.values() if r.status.kind is kind]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"no {kind.value} shared-memory region {name!r} is registered")
        if region.status.kind is not kind:
            raise NotFound(
                f"region {name!r} is registered as {region.status.kind.value} shared memory, "
                f"not {kind.value}"
            )
        return [region.status]

    def users(self, name: str) -> int:
        """Requests that hold region `name` now (0 when there is no such region)."""
        with self._lock:
            region = self._regions.get(name)
            return region.users if region is not None else 0

    def unregister(self, kind: RegionKind, name: str = "") -> None:
        """Unregister one region, or every region of `kind` when `name` is empty.

        A region no request uses is released at once; one in use is released when its last
        request is done with it. An unknown name is not an error (the region is gone either way).
        """
        if not self.enabled:
            raise Unsupported(DISABLED)
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is not None and region.status.kind is not kind:
                    raise InvalidInput(
                        f"region {name!r} is {region.status.kind.value} shared memory; "
                        f"unregister it as such, not as {kind.value}"
                    )
                chosen = [region] if region is not None else []
            else:
                chosen = [r for r in self._regions.values() if r.status.kind is kind]
            released = [r for r in chosen if self._retire(r)]
        for region in released:
            self._release(region)

    def close(self) -> None:
        """Release every region (the server is stopping and its requests are done)."""
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
        for region in regions:
            self._release(region)

    def _retire(self, region: _Region) -> bool:
        """Take a region out of service (lock held); True when it can be released now."""
        region.retiring = True
        if region.users:
            log.info("region %r is in use: released after its requests", region.status.name)
            return False
        del self._regions[region.status.name]
        return True

    def _release(self, region: _Region) -> None:
        region.memory.close()
        self._give_back(region.status.kind)
        log.info("released %s", region.status)

    def _give_back(self, kind: RegionKind) -> None:
        if kind is RegionKind.SYSTEM and self.descriptors is not None:
            self.descriptors.release()

    # -- leases ------------------------------------------------------------------------------------

    def _acquire(self, ref: RegionRef, role: str, name: str) -> _Region:
        """The region a tensor names, checked and counted as used (until the lease ends)."""
        if not self.enabled:
            raise Unsupported(f"{role} {name!r} names a shared-memory region, but {DISABLED}")
        with self._lock:
            region = self._regions.get(ref.region)
            if region is None or region.retiring:
                state = "is being unregistered" if region else "is not registered"
                raise InvalidInput(f"{role} {name!r}: shared-memory region {ref.region!r} {state}")
            size = region.status.byte_size
            if ref.offset + ref.byte_size > size:
                raise InvalidInput(
                    f"{role} {name!r}: shared_memory_offset {ref.offset} + "
                    f"shared_memory_byte_size {ref.byte_size} exceed the {size} bytes of "
                    f"region {ref.region!r}"
                )
            region.users += 1
            return region

    def _done(self, regions: list[_Region]) -> None:
        released = []
        with self._lock:
            for region in regions:
                region.users -= 1
                if region.retiring and region.users == 0:
                    del self._regions[region.status.name]
                    released.append(region)
        for region in released:
            self._release(region)


class Lease:
    """The regions one request uses; they stay mapped until every holder has released it.

    The DataPlane holds it while it resolves inputs and writes outputs; the batcher holds it
    (`hold`) while the inputs wait in its queue or are computed, which may outlast a request
    whose client has gone away.
    """

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._regions: list[_Region] = []
        self._holders = 1

    def input(self, name: str, placed: RegionTensor, device: str | None) -> Any:
        """An input's array over its region: a numpy view, or a device array on `device`."""
        region = self._use(placed.ref, "input", name)
        tensor = WireTensor("input", name, placed.datatype, placed.shape)
        ref = placed.ref
        memory = region.memory
        if isinstance(memory, ClientObject):
            copy = memory.read(ref.offset, ref.byte_size)
            return read_tensor(tensor, RawData(copy.data, REGION_WORDS))
        _check_device_datatype(tensor)
        check_raw_size(tensor, ref.byte_size, REGION_WORDS)
        array = memory.array(ref.offset, ref.byte_size)
        if device != f"cuda:{memory.device_id}":
            array = cuda_memory.to_host(array)  # the model computes elsewhere
        return array.view(placed.datatype.numpy).reshape(placed.shape)

    def check_output(self, name: str, ref: RegionRef) -> None:
        """Check, before computing, that an output's place lies inside its region."""
        self._use(ref, "output", name)

    def write(self, name: str, array: Any, ref: RegionRef) -> RegionTensor:
        """Write an output into its region; what the answer says of it instead of data."""
        region = next(r for r in self._regions if r.status.name == ref.region)
        datatype = Datatype.from_numpy(cuda_memory.dtype_of(array))
        memory = region.memory
        if isinstance(memory, ClientObject):
            raw = write_tensor("output", name, cuda_memory.to_host(array), datatype, Form.RAW).raw
            assert raw is not None
            size = len(raw)
            _check_fits(name, size, ref)
            memory.write(ref.offset, memoryview(raw).cast("B"))
        else:
            _check_device_datatype(WireTensor("output", name, datatype, tuple(array.shape)))
            size = int(np.prod(array.shape)) * datatype.itemsize
            _check_fits(name, size, ref)
            cuda_memory.write_device(memory.array(ref.offset, size), array)
        shape = tuple(int(d) for d in array.shape)
        return RegionTensor(datatype, shape, RegionRef(ref.region, size, ref.offset))

    def hold(self) -> Callable[[], None]:
        """Another holder of the lease; call what it returns, once, when done with it."""
        self._holders += 1
        return self.release

    def release(self) -> None:
        """One holder is done; the last one gives the regions back."""
        self._holders -= 1
        if self._holders == 0 and self._regions:
            self._registry._done(self._regions)
            self._regions = []

    def _use(self, ref: RegionRef, role: str, name: str) -> _Region:
        region = self._registry._acquire(ref, role, name)
        self._regions.append(region)
        return region


def _check_sizes(offset: int, byte_size: int) -> None:
    for key, value in (("offset", offset), ("byte_size", byte_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"{key} must be a non-negative integer, got {value!r}")
    if byte_size == 0:
        raise InvalidInput("byte_size 0: a region holds at least one byte")


def _check_fits(name: str, size: int, ref: RegionRef) -> None:
    if size > ref.byte_size:
        raise InvalidInput(
            f"output {name!r} takes {size} bytes, more than its shared_memory_byte_size "
            f"{ref.byte_size} in region {ref.region!r}"
        )


def _check_device_datatype(tensor: WireTensor) -> None:
    if tensor.datatype is Datatype.BYTES:
        raise InvalidInput(
            f"{tensor.role} {tensor.name!r} is BYTES, which a CUDA shared-memory region cannot "
            "hold: use system shared memory or the message body"
        )
