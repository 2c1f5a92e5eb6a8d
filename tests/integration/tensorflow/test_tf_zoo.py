"""The zoo's TensorFlow entries served: tf-image (a SavedModel), tf-text (a .keras file) and
tf-image-e2e (JPEG bytes -> the image step -> tf-image), built by `build_zoo` and answered
through the real tritonclient as the same Keras models, rebuilt from code in this process
(seeded weights), answer on the same inputs.

TensorFlow is imported only inside the fixtures (through dlscale's imports module, which loads
Triton first), never at collection: docs/backends.md, "Importing dlscale imports no TensorFlow".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.images import reference_pixels
from tests.toolkit.server import LocalServer, serving

from dlscale.models.zoo import TF_MODELS, build_zoo
from dlscale.models.zoo.jpegs import encode_jpeg, synthetic_pixels

IMAGES, IMAGES_SEED = 4, 31
#: Float tolerance between the server's TensorFlow call and this process's Keras call: the
#: same graph on the same numbers, batched differently.
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def keras_models() -> dict[str, Any]:
    """Every TensorFlow zoo model rebuilt from code here, by name (what each build writes)."""
    pytest.importorskip("dlscale.backends.tensorflow.imports", reason="needs [tensorflow]")
    return {name: model.keras_model() for name, model in TF_MODELS.items()}


@pytest.fixture(scope="module")
def server(
    keras_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("tfzoo")
    build_zoo(root, ["tf-image-e2e", "tf-text"])  # tf-image comes with its pipeline
    with serving(root) as running:
        yield running


def _infer(server: LocalServer, protocol: str, model: str, **arrays: np.ndarray) -> Any:
    lib: Any = th if protocol == "http" else tg
    client = lib.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    tensors = []
    for name, array in arrays.items():
        kind = "BYTES" if array.dtype == object else {"float32": "FP32", "int64": "INT64"}
        datatype = kind if isinstance(kind, str) else kind[str(array.dtype)]
        tensor = lib.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    try:
        return client.infer(model, tensors)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tf_image_savedmodel_answers_as_keras_in_process(
    server: LocalServer, keras_models: dict[str, Any], protocol: str
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 64, 64, 3)).astype(np.float32)
    got = _infer(server, protocol, "tf-image", input=x).as_numpy("scores")
    want = np.asarray(keras_models["tf-image"](x, training=False))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_tf_text_keras_file_answers_as_keras_in_process(
    server: LocalServer, keras_models: dict[str, Any]
) -> None:
    meta = th.InferenceServerClient(server.http_url).get_model_metadata("tf-text")
    assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 32]}]
    ids = np.random.default_rng(1).integers(0, 1000, (5, 32), dtype=np.int64)
    got = _infer(server, "http", "tf-text", input_ids=ids).as_numpy("scores")
    want = np.asarray(keras_models["tf-text"](ids, training=False))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tf_image_e2e_answers_as_keras_on_the_decoded_image(
    server: LocalServer, keras_models: dict[str, Any], protocol: str
) -> None:
    pixels, classes = synthetic_pixels(IMAGES, IMAGES_SEED)
    jpegs = np.array([[encode_jpeg(p)] for p in pixels], dtype=object)
    answer = _infer(server, protocol, "tf-image-e2e", image=jpegs)
    scores, labels = answer.as_numpy("scores"), answer.as_numpy("labels")
    # The pipeline's first step alone, on the same bytes: the decoded, resized, cropped and
    # normalized NHWC pixels that tf-image got; Keras on them here gives the pipeline's scores.
    decoded = _infer(server, protocol, "tf-image-e2e-image", image=jpegs).as_numpy("pixels")
    assert decoded.shape == (IMAGES, 64, 64, 3)
    model = keras_models["tf-image"]
    np.testing.assert_allclose(scores, np.asarray(model(decoded)), rtol=RTOL, atol=ATOL)
    # Its head is fitted to the synthetic classes: each photo gets its drawn class, as the
    # same Keras model does on pixels prepared by hand (simplejpeg, Pillow's resize).
    by_hand = np.stack([reference_pixels(j[0]).transpose(1, 2, 0) for j in jpegs])
    # Close, not equal: the step decodes at a reduced DCT size and resamples the crop's exact
    # box (test_processing_image.py); a wrong layout, channel order or normalization is not.
    assert np.abs(decoded - by_hand).mean() < 0.1
    assert np.asarray(model(by_hand)).argmax(1).tolist() == classes.tolist()
    assert scores.argmax(1).tolist() == classes.tolist()
    tops = [row[0].decode().split(":") for row in labels]
    assert [(int(i), name) for _, i, name in tops] == [(c, f"pattern-{c:02d}") for c in classes]
