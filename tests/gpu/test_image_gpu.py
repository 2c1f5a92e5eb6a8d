"""The image step on a GPU: nvJPEG decoding against the CPU path, a bad file failing alone in a
batch, and a pipeline whose pixels stay on the device between the image step and the classifier.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_image_gpu.py` (needs torchvision and CuPy).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("cupy")
import tritonclient.http as th  # noqa: E402
from tests.toolkit.images import CROP, RESIZE, top_indices  # noqa: E402
from tests.toolkit.server import LocalServer, serving  # noqa: E402

from dlscale.backends import BackendOptions  # noqa: E402
from dlscale.backends.processing.image import ImageBackend  # noqa: E402
from dlscale.errors import DlscaleError  # noqa: E402
from dlscale.models.zoo.e2e import SMALLCNN, SMALLCNN_E2E, image_pipeline  # noqa: E402
from dlscale.models.zoo.images import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from dlscale.models.zoo.jpegs import encode_jpeg, synthetic_pixels  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SETTINGS = {
    "resize": RESIZE,
    "crop": CROP,
    "mean": IMAGENET_MEAN.ravel().tolist(),
    "std": IMAGENET_STD.ravel().tolist(),
}


def step(device: str, tmp_path: Path) -> ImageBackend:
    backend = ImageBackend(
        tmp_path / "model.image", BackendOptions(device, max_batch_size=16, extra=SETTINGS)
    )
    backend.load()
    return backend


def test_nvjpeg_pixels_are_close_to_the_cpu_ones(tmp_path: Path) -> None:
    pixels, _ = synthetic_pixels(8, seed=2)
    rows = {"image": np.array([[encode_jpeg(p)] for p in pixels], dtype=object)}
    cpu = step("cpu", tmp_path).infer(rows)["pixels"]
    gpu = step("cuda:0", tmp_path).infer(rows)["pixels"]
    assert gpu.shape == cpu.shape and gpu.dtype == cpu.dtype
    # Two decoders (libjpeg-turbo with DCT scaling, nvJPEG full size) and two resamplers.
    assert np.abs(gpu - cpu).mean() < 0.1


def test_a_bad_jpeg_fails_alone_in_a_device_batch(tmp_path: Path) -> None:
    pixels, _ = synthetic_pixels(2, seed=3)
    good = encode_jpeg(pixels[0])
    gpu = step("cuda:0", tmp_path)

    def rows(*items: bytes) -> dict[str, np.ndarray]:
        return {"image": np.array([[i] for i in items], dtype=object)}

    results = gpu.infer_requests([rows(good), rows(good[: len(good) // 2]), rows(good)])
    assert isinstance(results[1], DlscaleError)
    alone = gpu.infer(rows(good))["pixels"]
    for result in (results[0], results[2]):
        assert isinstance(result, dict)
        np.testing.assert_allclose(result["pixels"], alone, atol=1e-5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("e2e_gpu")
    SMALLCNN_E2E.build(root)
    image_pipeline(root, "smallcnn-e2e-gpu", SMALLCNN, RESIZE, CROP, device="cuda:0")
    with serving(root) as running:
        yield running


def test_a_pipeline_handing_device_pixels_on_classifies_as_on_the_cpu(server: LocalServer) -> None:
    pixels, classes = synthetic_pixels(8, seed=4)
    data = np.array([[encode_jpeg(p)] for p in pixels], dtype=object)
    client = th.InferenceServerClient(server.http_url)
    answers = {}
    for model in ("smallcnn-e2e", "smallcnn-e2e-gpu"):
        tensor = th.InferInput("image", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        answers[model] = top_indices(client.infer(model, [tensor]).as_numpy("labels"))
    assert [r[0] for r in answers["smallcnn-e2e-gpu"]] == [r[0] for r in answers["smallcnn-e2e"]]
    assert [r[0] for r in answers["smallcnn-e2e"]] == classes.tolist()
    # The image step alone answers on the host, as any model's answer to a client.
    tensor = th.InferInput("image", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    alone = client.infer("smallcnn-e2e-gpu-image", [tensor]).as_numpy("pixels")
    assert alone.shape == (8, 3, CROP, CROP)
