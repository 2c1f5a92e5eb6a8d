"""The shared-memory RPCs of the gRPC service (Triton's system and CUDA extensions).

The servicer's six RPCs of this group delegate here; the registry (serving/regions/registry.py)
does the work, and this module only reads requests and writes answers.
"""

from __future__ import annotations

from typing import Any

from dlscale.serving.regions.registry import RegionKind, SharedMemoryRegistry
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb


class SharedMemoryRpcs:
    """Status, register and unregister of both kinds of region over one registry."""

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry = registry

    def system_status(self, request: Any) -> Any:
        """SystemSharedMemoryStatusResponse: the regions by name."""
        answer = pb.SystemSharedMemoryStatusResponse()
        for s in self.registry.status(RegionKind.SYSTEM, request.name):
            answer.regions[s.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=s.name, key=s.key, offset=s.offset, byte_size=s.byte_size
                )
            )
        return answer

    def system_register(self, request: Any) -> Any:
        """SystemSharedMemoryRegisterResponse, once the region is mapped."""
        self.registry.register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def system_unregister(self, request: Any) -> Any:
        """SystemSharedMemoryUnregisterResponse (no name: every system region)."""
        self.registry.unregister(RegionKind.SYSTEM, request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def cuda_status(self, request: Any) -> Any:
        """CudaSharedMemoryStatusResponse: the regions by name."""
        answer = pb.CudaSharedMemoryStatusResponse()
        for s in self.registry.status(RegionKind.CUDA, request.name):
            answer.regions[s.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=s.name, device_id=s.device_id, byte_size=s.byte_size
                )
            )
        return answer

    def cuda_register(self, request: Any) -> Any:
        """CudaSharedMemoryRegisterResponse, once the IPC handle is open."""
        self.registry.register_cuda(
            request.name, bytes(request.raw_handle), request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    def cuda_unregister(self, request: Any) -> Any:
        """CudaSharedMemoryUnregisterResponse (no name: every CUDA region)."""
        self.registry.unregister(RegionKind.CUDA, request.name)
        return pb.CudaSharedMemoryUnregisterResponse()
