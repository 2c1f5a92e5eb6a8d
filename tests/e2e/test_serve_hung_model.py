"""`dlscale serve` with a Python model hung in execute: SIGTERM still stops the server (its
worker killed after the grace) and no shared-memory segment of the server is left behind."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tests.toolkit.cli import served
from tests.toolkit.python_models import FRAGILE, FRAGILE_CONFIG, write_triton_python_model
from tritonclient.utils import InferenceServerException

from dlscale.wire.segments import RESERVED_PREFIX, SHM_DIR


def test_sigterm_stops_a_server_whose_python_model_hangs(tmp_path: Path) -> None:
    folder = write_triton_python_model(tmp_path, "fragile", FRAGILE, FRAGILE_CONFIG)
    with served(tmp_path, "--grace-s", "1") as server:
        prefix = f"{RESERVED_PREFIX}{server.proc.pid}."
        errors: list[str] = []

        def hang() -> None:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
            forever = np.full((1, 4), 1e12, np.float32)  # execute sleeps x / 1000 s
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(forever)
            try:
                client.infer("fragile", [tensor])
            except InferenceServerException as exc:
                errors.append(str(exc))
            finally:
                client.close()

        caller = threading.Thread(target=hang)
        caller.start()
        for _ in range(1200):  # a safety net: the model touches the file as execute begins
            if (folder / "sleeping").exists():
                break
            time.sleep(0.05)
        assert list(SHM_DIR.glob(f"{prefix}*")), "the worker's segments exist while it computes"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0  # a safety net: before, it never stopped
        caller.join(60)
        assert "killed" in server.log()
    assert not list(SHM_DIR.glob(f"{prefix}*")), "no segment of the server is left behind"
    assert errors and "503" in errors[0]
