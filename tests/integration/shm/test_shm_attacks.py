"""Attacks on shared memory, performed against a real server: each one is refused with a 4xx,
fails only its own request, and the server keeps serving (docs/shared-memory.md, trust model)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tests.integration.shm.conftest import Region, module
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS, rest_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

from dlscale.serving.regions.system import RESERVED_PREFIX, SHM_DIR, shm_path

X = np.arange(2 * 16, dtype=np.float32).reshape(2, 16)
NOBODY = 65534
IMAGES = BATCHED.format(max_batch=8, delay=0) + NULL_TENSORS.format(
    inp="input", out="output", width="3, 224, 224", out_width="3, 224, 224"
)


def _refused(protocol: str, status: tuple[str, str], match: str, call: Any, *args: Any) -> None:
    with pytest.raises(InferenceServerException, match=match) as info:
        call(*args)
    assert info.value.status() == (status[0] if protocol == "http" else status[1])


BAD_REQUEST = ("400", "StatusCode.INVALID_ARGUMENT")
FORBIDDEN = ("403", "StatusCode.PERMISSION_DENIED")


def _infer(client: Any, protocol: str, name: str) -> np.ndarray:
    tc = module(protocol)
    inp = tc.InferInput("x", list(X.shape), "FP32")
    inp.set_shared_memory(name, X.nbytes)
    return np.asarray(client.infer("identity", [inp]).as_numpy("y"))


def _serves(client: Any, protocol: str, region: Region) -> None:
    """The server answers the next request, from a fresh region."""
    name, key, handle = region(X.nbytes)
    shm.set_shared_memory_region(handle, [X])
    client.register_system_shared_memory(name, key, X.nbytes)
    np.testing.assert_array_equal(_infer(client, protocol, name), X)


def test_truncating_a_registered_object_fails_only_that_request(
    client: Any, protocol: str, region: Region
) -> None:
    name, key, handle = region(X.nbytes)
    shm.set_shared_memory_region(handle, [X])
    client.register_system_shared_memory(name, key, X.nbytes)
    os.truncate(shm_path(key), 0)  # a mapping read now is SIGBUS: the whole server would die
    _refused(protocol, BAD_REQUEST, "shrank to 0 bytes", _infer, client, protocol, name)
    _serves(client, protocol, region)


def test_replacing_a_registered_object_fails_the_request(
    client: Any, protocol: str, region: Region
) -> None:
    name, key, handle = region(X.nbytes)
    shm.set_shared_memory_region(handle, [X])
    client.register_system_shared_memory(name, key, X.nbytes)
    path = shm_path(key)
    path.unlink()
    path.write_bytes((X + 1).tobytes())  # the same name, another object
    _refused(protocol, BAD_REQUEST, "was replaced", _infer, client, protocol, name)
    client.unregister_system_shared_memory(name)
    client.register_system_shared_memory(name, key, X.nbytes)  # it passes the rules: taken
    np.testing.assert_array_equal(_infer(client, protocol, name), X + 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's object needs root")
def test_another_users_private_object_cannot_be_registered(
    client: Any, protocol: str, region: Region
) -> None:
    name, key, _ = region(X.nbytes)
    os.chown(shm_path(key), NOBODY, NOBODY)  # as if user nobody had made it with mode 0600
    shm_path(key).chmod(0o600)
    _refused(
        protocol, FORBIDDEN, f"belongs to uid {NOBODY}",
        client.register_system_shared_memory, name, key, X.nbytes,
    )  # fmt: skip
    assert name not in [r["name"] for r in _status(client, protocol)]
    _serves(client, protocol, region)


def _status(client: Any, protocol: str) -> list[dict[str, Any]]:
    if protocol == "http":
        return list(client.get_system_shared_memory_status())
    return list(client.get_system_shared_memory_status(as_json=True).get("regions", {}).values())


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = rest_repository(tmp_path_factory.mktemp("shm_workers"))
    write_null_model(root, "echo", IMAGES)
    with serving(root, http_workers=2, allow_client_shm=True) as running:
        yield running


def _echo(url: str, x: np.ndarray) -> np.ndarray:
    client = th.InferenceServerClient(url)  # a fresh connection: either worker may take it
    try:
        tensor = th.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        return np.asarray(client.infer("echo", [tensor]).as_numpy("output"))
    finally:
        client.close()


def test_a_worker_body_segment_cannot_be_registered(workers_server: LocalServer) -> None:
    url = workers_server.http_url
    victim = np.random.default_rng(0).random((2, 3, 224, 224), np.float32)
    np.testing.assert_array_equal(_echo(url, victim), victim)
    segments = sorted(SHM_DIR.glob(f"{RESERVED_PREFIX}*"))
    assert segments, "the workers keep their body segments pooled: the attack has a target"
    attacker = th.InferenceServerClient(url)
    try:
        for index, segment in enumerate(segments):
            size = segment.stat().st_size
            _refused(
                "http", FORBIDDEN, "server's own",
                attacker.register_system_shared_memory, f"stolen{index}", f"/{segment.name}", size,
            )  # fmt: skip
        assert attacker.get_system_shared_memory_status() == []
    finally:
        attacker.close()
    later = np.random.default_rng(1).random((2, 3, 224, 224), np.float32)
    np.testing.assert_array_equal(_echo(url, later), later)  # the victim's rows stay its own


def test_the_servers_own_object_is_refused_under_another_name(
    workers_server: LocalServer,
) -> None:
    url = workers_server.http_url
    x = np.ones((1, 3, 224, 224), np.float32)
    np.testing.assert_array_equal(_echo(url, x), x)  # the owner has mapped a segment now
    segment = next(iter(sorted(SHM_DIR.glob(f"{RESERVED_PREFIX}*"))))
    alias = SHM_DIR / f"innocent-{os.getpid()}"
    os.link(segment, alias)  # another name for the same object
    attacker = th.InferenceServerClient(url)
    try:
        _refused(
            "http", FORBIDDEN, "the server owns or one with several names",
            attacker.register_system_shared_memory, "alias", f"/{alias.name}", 64,
        )  # fmt: skip
    finally:
        alias.unlink()
        attacker.close()


def test_a_truncated_region_through_a_worker_fails_only_its_request(
    workers_server: LocalServer,
) -> None:
    url = workers_server.http_url
    x = np.full((1, 3, 224, 224), 2.0, np.float32)
    key = f"/dlscale-test-trunc-{os.getpid()}"
    handle = shm.create_shared_memory_region("trunc", key, x.nbytes)
    client = th.InferenceServerClient(url)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("trunc", key, x.nbytes)
        os.truncate(shm_path(key), 0)  # SIGBUS in the model process, were it read in place
        tensor = th.InferInput("input", list(x.shape), "FP32")
        tensor.set_shared_memory("trunc", x.nbytes)
        _refused("http", BAD_REQUEST, "shrank to 0 bytes", client.infer, "echo", [tensor])
        client.unregister_system_shared_memory("trunc")
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)
    np.testing.assert_array_equal(_echo(url, x), x)  # the model process lives
