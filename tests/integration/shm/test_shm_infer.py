"""System shared memory with real tritonclient over REST and gRPC: registry, inputs, outputs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tests.integration.shm.conftest import Region, module, system_status
from tests.toolkit.server import LocalServer
from tritonclient.utils import serialize_byte_tensor

from dlscale.serving.regions import cuda as cuda_memory


def test_extensions_advertise_what_the_server_has(client: Any, protocol: str) -> None:
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if protocol == "http" else list(meta.extensions)
    assert "system_shared_memory" in extensions
    # CUDA regions only where this machine has a CUDA device the server can use.
    assert ("cuda_shared_memory" in extensions) == (cuda_memory.device_count() > 0)


def test_register_lists_and_unregister_removes(client: Any, protocol: str, region: Region) -> None:
    name, key, _ = region(4096)
    other, other_key, _ = region(8192)
    client.register_system_shared_memory(name, key, 1024, offset=100)
    client.register_system_shared_memory(other, other_key, 8192)
    status = system_status(client, protocol)
    assert status[name] == {"name": name, "key": key, "offset": 100, "byte_size": 1024}
    assert status[other]["byte_size"] == 8192
    one = client.get_system_shared_memory_status(name)
    assert (one[0]["name"] if protocol == "http" else next(iter(one.regions))) == name
    client.unregister_system_shared_memory(name)
    assert set(system_status(client, protocol)) == {other}
    client.unregister_system_shared_memory()
    assert system_status(client, protocol) == {}


def test_inputs_and_outputs_in_regions_at_offsets(
    client: Any, protocol: str, region: Region
) -> None:
    x = np.arange(3 * 16, dtype=np.float32).reshape(3, 16)
    in_name, in_key, in_handle = region(4096)
    out_name, out_key, out_handle = region(4096)
    shm.set_shared_memory_region(in_handle, [x], offset=512)
    # The input region starts 256 bytes into its object; the tensor 256 bytes into the region.
    client.register_system_shared_memory(in_name, in_key, 2048, offset=256)
    client.register_system_shared_memory(out_name, out_key, 4096)
    tc = module(protocol)
    inp = tc.InferInput("x", list(x.shape), "FP32")
    inp.set_shared_memory(in_name, x.nbytes, offset=256)
    out = tc.InferRequestedOutput("y")
    out.set_shared_memory(out_name, x.nbytes, offset=1000)
    result = client.infer("identity", [inp], outputs=[out])
    answered = result.get_output("y")
    shape = answered["shape"] if protocol == "http" else list(answered.shape)
    assert shape == [3, 16]
    if protocol == "http":
        assert "data" not in answered
    else:
        assert answered.parameters["shared_memory_region"].string_param == out_name
    got = shm.get_contents_as_numpy(out_handle, np.float32, [3, 16], offset=1000)
    np.testing.assert_array_equal(got, x)


def test_regions_mix_with_tensors_in_the_message(
    client: Any, protocol: str, region: Region
) -> None:
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)
    b = np.full((2, 4), 10, dtype=np.float32)
    in_name, in_key, in_handle = region(a.nbytes)
    out_name, out_key, out_handle = region(a.nbytes)
    shm.set_shared_memory_region(in_handle, [a])
    client.register_system_shared_memory(in_name, in_key, a.nbytes)
    client.register_system_shared_memory(out_name, out_key, a.nbytes)
    tc = module(protocol)
    in_a = tc.InferInput("a", [2, 4], "FP32")
    in_a.set_shared_memory(in_name, a.nbytes)
    in_b = tc.InferInput("b", [2, 4], "FP32")
    in_b.set_data_from_numpy(b)
    out_sum = tc.InferRequestedOutput("sum")
    out_sum.set_shared_memory(out_name, a.nbytes)
    out_diff = tc.InferRequestedOutput("diff")
    result = client.infer("sum_and_diff", [in_a, in_b], outputs=[out_sum, out_diff])
    np.testing.assert_array_equal(result.as_numpy("diff"), a - b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [2, 4]), a + b)


def test_bytes_tensors_travel_serialized(client: Any, protocol: str, region: Region) -> None:
    text = np.array([[b"alpha", b"be"], [b"", b"gamma-delta"]], dtype=object)
    wire = serialize_byte_tensor(text)
    size = len(wire.item())
    in_name, in_key, in_handle = region(size)
    out_name, out_key, out_handle = region(256)
    shm.set_shared_memory_region(in_handle, [wire])
    client.register_system_shared_memory(in_name, in_key, size)
    client.register_system_shared_memory(out_name, out_key, 256)
    tc = module(protocol)
    inp = tc.InferInput("text", [2, 2], "BYTES")
    inp.set_shared_memory(in_name, size)
    out = tc.InferRequestedOutput("echo")
    out.set_shared_memory(out_name, 256)
    client.infer("strings", [inp], outputs=[out])
    got = shm.get_contents_as_numpy(out_handle, np.object_, [2, 2])
    assert got.tolist() == text.tolist()


def test_many_requests_share_one_region_at_different_offsets(
    server: LocalServer, client: Any, protocol: str, region: Region
) -> None:
    requests, rows = 24, 2
    row_bytes = rows * 16 * 4
    in_name, in_key, in_handle = region(requests * row_bytes)
    out_name, out_key, out_handle = region(requests * row_bytes)
    inputs = [(np.full((rows, 16), i) + np.arange(16)).astype(np.float32) for i in range(requests)]
    shm.set_shared_memory_region(in_handle, inputs)
    client.register_system_shared_memory(in_name, in_key, requests * row_bytes)
    client.register_system_shared_memory(out_name, out_key, requests * row_bytes)
    tc = module(protocol)

    def one(i: int) -> None:
        c = tc.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
        try:
            inp = tc.InferInput("x", [rows, 16], "FP32")
            inp.set_shared_memory(in_name, row_bytes, offset=i * row_bytes)
            out = tc.InferRequestedOutput("y")
            # Outputs land in reverse order, so that no answer can be its own input by chance.
            out.set_shared_memory(out_name, row_bytes, offset=(requests - 1 - i) * row_bytes)
            c.infer("identity", [inp], outputs=[out])
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(requests)))
    for i in range(requests):
        offset = (requests - 1 - i) * row_bytes
        got = shm.get_contents_as_numpy(out_handle, np.float32, [rows, 16], offset=offset)
        np.testing.assert_array_equal(got, inputs[i])


@pytest.mark.parametrize("protocol", ["http"])
def test_a_server_without_allow_client_shm_refuses_regions(
    repo: Any, protocol: str, region: Region
) -> None:
    from tests.toolkit.server import serving
    from tritonclient.utils import InferenceServerException

    name, key, _ = region(64)
    with serving(repo, grpc_port=None) as plain:
        c = module(protocol).InferenceServerClient(plain.http_url)
        assert "system_shared_memory" not in c.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException, match="--allow-client-shm") as info:
            c.register_system_shared_memory(name, key, 64)
        assert info.value.status() == "501"
        assert c.get_system_shared_memory_status() == []
        c.close()
