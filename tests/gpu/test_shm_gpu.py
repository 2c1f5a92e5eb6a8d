"""CUDA shared memory on a GPU: tritonclient's CUDA regions against `dlscale serve`.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_shm_gpu.py` (needs CuPy and tritonclient's
CUDA utilities, i.e. cuda-python). The server runs in a process of its own, as in production:
CUDA cannot open an IPC handle in the process that made it. Two models: the zoo's mlp on the
torch backend on cuda:0 (inputs used in place on the GPU, outputs written there) and an ONNX
Runtime identity on the CPU (a CUDA region's bytes go through the host).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
import tritonclient.http as th  # noqa: E402
from tests.toolkit.models import identity_graph, write_model  # noqa: E402

from dlscale.backends.torch.files import write_module_spec  # noqa: E402
from dlscale.models.zoo import ZOO, build_zoo  # noqa: E402
from dlscale.models.zoo.model import WEIGHT_SEED  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("shm_gpu")
    build_zoo(root, ["mlp"])
    mlp = ZOO["mlp"]
    write_module_spec(
        root / "mlp" / "1" / "model.zoo",
        mlp.factory,
        {"seed": WEIGHT_SEED},
        [s.with_batch() for s in mlp.inputs()],
        [s.with_batch() for s in mlp.outputs()],
    )
    (root / "mlp" / "config.toml").write_text(
        'backend = "torch"\nmax_batch_size = 8\n[[instances]]\ncount = 1\ndevice = "cuda:0"\n'
    )
    write_model(root, "identity", identity_graph(16, "x", "y"), "max_batch_size = 8\n")
    port = _port()
    argv = [sys.executable, "-m", "dlscale", "serve", str(root), "--http-port", str(port)]
    argv += ["--grpc-port", "-1", "--metrics-port", "-1", "--allow-client-shm"]
    proc = subprocess.Popen(argv)
    url = f"127.0.0.1:{port}"
    try:
        for model in ("mlp", "identity"):
            while True:
                assert proc.poll() is None, "dlscale serve exited"
                try:
                    urllib.request.urlopen(f"http://{url}/v2/models/{model}/ready", timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _run(url: str, model: str, x: np.ndarray, out_name: str, out_bytes: int) -> np.ndarray:
    client = th.InferenceServerClient(url)
    assert "cuda_shared_memory" in client.get_server_metadata()["extensions"]
    inp_region = cudashm.create_shared_memory_region("gin", x.nbytes, 0)
    out_region = cudashm.create_shared_memory_region("gout", out_bytes, 0)
    try:
        cudashm.set_shared_memory_region(inp_region, [x])
        client.register_cuda_shared_memory(
            "gin", cudashm.get_raw_handle(inp_region).decode(), 0, x.nbytes
        )
        client.register_cuda_shared_memory(
            "gout", cudashm.get_raw_handle(out_region).decode(), 0, out_bytes
        )
        status = {r["name"]: r for r in client.get_cuda_shared_memory_status()}
        assert status["gin"] == {"name": "gin", "device_id": 0, "byte_size": x.nbytes}
        meta = client.get_model_metadata(model)
        inp = th.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
        inp.set_shared_memory("gin", x.nbytes)
        out = th.InferRequestedOutput(out_name)
        out.set_shared_memory("gout", out_bytes)
        answer = client.infer(model, [inp], outputs=[out]).get_output(out_name)
        got = cudashm.get_contents_as_numpy(out_region, np.float32, answer["shape"])
        return np.asarray(got)
    finally:
        client.unregister_cuda_shared_memory()
        assert client.get_cuda_shared_memory_status() == []
        cudashm.destroy_shared_memory_region(inp_region)
        cudashm.destroy_shared_memory_region(out_region)
        client.close()


def test_a_cuda_region_feeds_a_model_on_the_cpu(server: str) -> None:
    x = np.arange(4 * 16, dtype=np.float32).reshape(4, 16)
    np.testing.assert_array_equal(_run(server, "identity", x, "y", x.nbytes), x)


def test_a_cuda_region_feeds_a_torch_model_on_its_gpu_in_place(server: str) -> None:
    mlp = ZOO["mlp"]
    spec = mlp.inputs()[0]
    x = np.random.default_rng(0).standard_normal((4, *spec.shape)).astype(np.float32)
    out_spec = mlp.outputs()[0]
    out_bytes = 4 * int(np.prod(out_spec.shape)) * 4
    got = _run(server, "mlp", x, out_spec.name, out_bytes)
    # The same model through the message body is the reference.
    client = th.InferenceServerClient(server)
    inp = th.InferInput(spec.name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    expected = client.infer("mlp", [inp]).as_numpy(out_spec.name)
    client.close()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
