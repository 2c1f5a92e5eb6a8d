"""Every shared-memory mistake a client can make is a clear 400 / INVALID_ARGUMENT; regions in
use are released only after their requests; the bound on regions holds."""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tests.integration.shm.conftest import Region, module, system_status
from tests.toolkit.server import LocalServer
from tritonclient.utils import InferenceServerException

from dlscale.serving.regions import cuda as cuda_memory

X = np.arange(2 * 16, dtype=np.float32).reshape(2, 16)


def _code(protocol: str) -> str:
    return "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"


def _infer_from(
    client: Any, protocol: str, name: str, byte_size: int, offset: int = 0, datatype: str = "FP32"
) -> Any:
    tc = module(protocol)
    inp = tc.InferInput("x", list(X.shape), datatype)
    inp.set_shared_memory(name, byte_size, offset=offset)
    return client.infer("identity", [inp])


def _refused(protocol: str, match: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(InferenceServerException, match=match) as info:
        call(*args, **kwargs)
    assert info.value.status() == _code(protocol)


@pytest.fixture
def registered(client: Any, region: Region) -> tuple[str, Any]:
    """A 1 KiB region holding X at its start."""
    name, key, handle = region(1024)
    shm.set_shared_memory_region(handle, [X])
    client.register_system_shared_memory(name, key, 1024)
    return name, handle


def test_an_unknown_region(client: Any, protocol: str) -> None:
    _refused(protocol, "'nowhere' is not registered", _infer_from, client, protocol, "nowhere", 128)


def test_an_offset_past_the_region(client: Any, protocol: str, registered: Any) -> None:
    name, _ = registered
    _refused(protocol, "exceed the 1024 bytes", _infer_from, client, protocol, name, X.nbytes, 1000)


def test_a_size_that_does_not_fit_the_tensor(client: Any, protocol: str, registered: Any) -> None:
    name, _ = registered
    _refused(
        protocol,
        "takes 128 bytes, but its shared_memory_byte_size is 64",
        _infer_from,
        client,
        protocol,
        name,
        64,
    )


def test_a_datatype_the_model_does_not_take(client: Any, protocol: str, registered: Any) -> None:
    name, _ = registered
    _refused(
        protocol,
        "datatype FP32; the request gave FP64",
        _infer_from,
        client,
        protocol,
        name,
        256,
        0,
        "FP64",
    )


def test_an_output_region_too_small(
    client: Any, protocol: str, registered: Any, region: Region
) -> None:
    name, _ = registered
    out_name, out_key, _ = region(64)
    client.register_system_shared_memory(out_name, out_key, 64)
    tc = module(protocol)
    inp = tc.InferInput("x", list(X.shape), "FP32")
    inp.set_shared_memory(name, X.nbytes)
    out = tc.InferRequestedOutput("y")
    out.set_shared_memory(out_name, 64)
    _refused(
        protocol,
        "takes 128 bytes, more than its shared_memory_byte_size 64",
        client.infer,
        "identity",
        [inp],
        outputs=[out],
    )


def test_registering_what_does_not_exist_or_fit(client: Any, protocol: str, region: Region) -> None:
    name, key, _ = region(256)
    register = client.register_system_shared_memory
    _refused(protocol, "no shared-memory object", register, "a", "/dlscale-no-such-key", 64)
    _refused(protocol, "exceed the 256 bytes", register, "b", key, 200, offset=100)
    _refused(protocol, "region name", register, "bad name!", key, 64)
    _refused(protocol, "shared-memory key", register, "c", "/../etc/passwd", 64)
    register(name, key, 64)
    _refused(protocol, "already registered", register, name, key, 64)


def test_a_cuda_region_on_a_server_without_cuda(client: Any, protocol: str) -> None:
    if cuda_memory.device_count() > 0:
        pytest.skip("this server has a CUDA device: the GPU suite registers real CUDA regions")
    # tritonclient takes the handle base64-encoded: as text over REST, as bytes over gRPC.
    encoded = base64.b64encode(bytes(64))
    handle = encoded.decode() if protocol == "http" else encoded
    _refused(protocol, "no CUDA device", client.register_cuda_shared_memory, "g", handle, 0, 64)


@pytest.mark.parametrize("text", ["%%%", "\u00e9t\u00e9"])
def test_a_cuda_handle_that_is_not_base64_is_the_clients_mistake(
    server: LocalServer, text: str
) -> None:
    # Characters beyond ASCII made the decoder raise a ValueError, which was a 500.
    doc = {"raw_handle": {"b64": text}, "device_id": 0, "byte_size": 64}
    url = f"http://{server.http_url}/v2/cudasharedmemory/region/g/register"
    answer = httpx.post(url, json=doc)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("raw_handle.b64 is not valid base64")


def test_data_and_a_region_at_once(server: LocalServer, registered: Any) -> None:
    name, _ = registered
    doc = {
        "inputs": [
            {
                "name": "x",
                "shape": [2, 16],
                "datatype": "FP32",
                "data": X.ravel().tolist(),
                "parameters": {"shared_memory_region": name, "shared_memory_byte_size": 128},
            }
        ]
    }
    answer = httpx.post(f"http://{server.http_url}/v2/models/identity/infer", json=doc)
    assert answer.status_code == 400
    assert (
        "give one of 'data', 'binary_data_size' or 'shared_memory_region'" in answer.json()["error"]
    )


def test_unregister_waits_for_the_queued_request(
    server: LocalServer, client: Any, protocol: str, region: Region
) -> None:
    name, key, handle = region(1024)
    row = np.arange(16, dtype=np.float32).reshape(1, 16)
    shm.set_shared_memory_region(handle, [row])
    client.register_system_shared_memory(name, key, 1024)
    tc = module(protocol)
    inp = tc.InferInput("input", [1, 16], "FP32")
    inp.set_shared_memory(name, row.nbytes)
    registry = server.dataplane.shared_memory
    # "queued" holds a request until its batch has 8 rows: this one waits, holding the region.
    url = server.http_url if protocol == "http" else server.grpc_url
    waiting = tc.InferenceServerClient(url)
    pool = ThreadPoolExecutor(1)
    pending = pool.submit(waiting.infer, "queued", [inp])
    while registry.users(name) == 0:
        time.sleep(0.001)  # until the server holds the request (the test's timeout bounds it)
    client.unregister_system_shared_memory(name)
    assert name in system_status(client, protocol)  # released only after its request
    _refused(protocol, "is being unregistered", _infer_from, client, protocol, name, 64)
    filler = tc.InferInput("input", [7, 16], "FP32")
    filler.set_data_from_numpy(np.zeros((7, 16), np.float32))
    client.infer("queued", [filler])  # the batch fills and runs
    result = pending.result()
    pool.shutdown()
    waiting.close()
    np.testing.assert_array_equal(result.as_numpy("output"), row)
    assert name not in system_status(client, protocol)


def test_the_bound_on_regions(client: Any, protocol: str, region: Region) -> None:
    for _ in range(16):  # the suite's server takes 16
        name, key, _ = region(64)
        client.register_system_shared_memory(name, key, 64)
    name, key, _ = region(64)
    _refused(protocol, "maximum of 16", client.register_system_shared_memory, name, key, 64)
