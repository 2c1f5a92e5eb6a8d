"""A request's shared-memory regions: bound to its inputs before compute, its outputs placed after.

The registry (registry.py) leases regions; this module is what one inference does with its lease:
inputs named in regions become arrays over them (on the model's device when every instance reads
device buffers in place), outputs asked into regions are checked before compute and written after,
and the lease is held by the batcher while it still reads the inputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.serving.regions.cuda import to_host as to_host
from dlscale.serving.regions.registry import Lease, SharedMemoryRegistry
from dlscale.types import InferenceRequest, RegionTensor


class RequestRegions:
    """The regions one request names, leased until its lease is released (see the module)."""

    def __init__(self, request: InferenceRequest, lease: Lease) -> None:
        self.request = request
        #: Held by the batcher while it reads the inputs (`hold`); `release`d once answered,
        #: when the regions may be unregistered.
        self.lease = lease

    @classmethod
    def of(cls, registry: SharedMemoryRegistry, request: InferenceRequest) -> RequestRegions | None:
        """A lease for the request's regions; None when it names none (no lease is taken)."""
        if not request.in_regions:  # a loop, not `any` over a generator: every request asks
            for output in request.outputs or ():
                if output.region:
                    break
            else:
                return None
        return cls(request, Lease(registry))

    def bind(self, devices: Iterable[str | None]) -> None:
        """Inputs in regions become arrays over them; outputs' places are checked before compute.

        `devices`: what each instance of the model reads in place (`Capabilities.device_buffers`);
        inputs land on that device only when all agree.
        """
        request = self.request
        device = _common(devices) if request.in_regions else None
        for name, placed in request.in_regions.items():
            if name in request.inputs:
                raise InvalidInput(f"input {name!r} is given twice: in the message and in a region")
            request.inputs[name] = self.lease.input(name, placed, device)
        for output in request.outputs or ():
            if output.region is not None:
                self.lease.check_output(output.name, output.region)

    def place(self, outputs: dict[str, Any]) -> dict[str, RegionTensor]:
        """Write the outputs asked into regions; what the answer says of each instead of data."""
        return {
            o.name: self.lease.write(o.name, outputs[o.name], o.region)
            for o in self.request.outputs or ()
            if o.region is not None
        }


def step_inputs(devices: Iterable[str | None], inputs: dict[str, Any]) -> dict[str, Any]:
    """A pipeline step's inputs as its model reads them. An earlier step may have left them on
    its device (a torch tensor, a CuPy array): they stay there for a model whose every instance
    reads that device in place, and come to the host for any other (a CPU step, such as top-k)."""
    if _common(devices) is not None or all(type(a) is np.ndarray for a in inputs.values()):
        return inputs
    return {name: to_host(array) for name, array in inputs.items()}


def _common(devices: Iterable[str | None]) -> str | None:
    found = set(devices)
    return found.pop() if len(found) == 1 else None
