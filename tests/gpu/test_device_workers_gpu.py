"""On a GPU machine: `--device-workers auto` puts one worker on each GPU (or MIG slice), and
CUDA, shown a device's UUID as each worker is, sees that one device only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as th
from tests.toolkit.gpu import gpus_seen, host
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import free_port
from tests.toolkit.waiting import until

from dlscale.scale.devices import VISIBLE_ENV, devices_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy"),
]

if not host().gpus:
    pytest.skip(gpus_seen(), allow_module_level=True)

#: The CUDA driver's own count of the devices this process sees (no framework needed).
CUDA_COUNT = (
    "import ctypes; cuda = ctypes.CDLL('libcuda.so.1'); assert cuda.cuInit(0) == 0; "
    "n = ctypes.c_int(); assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0; print(n.value)"
)


def test_cuda_sees_one_device_under_each_workers_uuid() -> None:
    devices = devices_for("auto", host())
    assert devices and all(d.visible for d in devices)
    for device in devices:
        env = device.env({"PATH": "/usr/bin:/bin"})
        seen = subprocess.run(
            [sys.executable, "-c", CUDA_COUNT], env=env, capture_output=True, text=True, check=True
        )
        assert seen.stdout.strip() == "1", (device, seen.stdout, seen.stderr)


def test_auto_serves_one_worker_per_device_through_one_port(tmp_path: Path) -> None:
    config = BATCHED.format(max_batch=8, delay=0) + NULL_TENSORS.format(
        inp="x", out="y", width=4, out_width=4
    )
    write_null_model(tmp_path, "echo", config)
    http, metrics = free_port(), free_port()
    argv = [
        sys.executable, "-m", "dlscale", "serve", str(tmp_path), "--device-workers", "auto",
        "--http-port", str(http), "--grpc-port", "-1", "--metrics-port", str(metrics),
    ]  # fmt: skip
    fleet = subprocess.Popen(argv)
    try:
        client = th.InferenceServerClient(f"127.0.0.1:{http}")
        until(lambda: _ready(client), 300)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30) as got:
            text = got.read().decode()
        rows = re.findall(
            r'^dlscale_device_worker_up\{device="([^"]+)",pid="(\d+)"\} 1\.0$', text, re.M
        )
        by_name = {d.name: d.visible for d in devices_for("auto", host())}
        assert {name for name, _ in rows} == set(by_name)
        for name, pid in rows:  # each worker was shown its own device, by UUID
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"{VISIBLE_ENV}={by_name[name]}".encode() in environ
    finally:
        fleet.terminate()
        fleet.wait(120)


def _ready(client: th.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready())
    except Exception:  # the router is not listening yet
        return False
