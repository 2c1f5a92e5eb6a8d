"""The zoo's end-to-end pipelines as a Triton user meets them: JPEG, PNG or text in, labels out,
over REST and gRPC with tritonclient; checked against decoding or tokenizing in the test and
calling the classifier directly; hostile inputs failing alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.cli import run_cli
from tests.toolkit.images import jpeg_bomb, png, png_bomb, reference_pixels, top_indices
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

from dlscale.models.repository import ModelRepository
from dlscale.models.zoo import DECODERS, PIPELINES, TF_MODELS, ZOO
from dlscale.models.zoo.e2e import SMALLCNN_E2E
from dlscale.models.zoo.e2e_text import text_pipeline, tokenize
from dlscale.models.zoo.jpegs import encode_jpeg, synthetic_pixels
from dlscale.models.zoo.nets.bert import BertConfig
from dlscale.models.zoo.text import CLASSES, sentences

#: bert-e2e's builder with a small BERT (the classifier's size is all that differs).
TEXT = "minibert-e2e"
SMALL_BERT = BertConfig(hidden=64, layers=2, heads=2, intermediate=128)
IMAGES_SEED, IMAGES = 21, 6


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("e2e")
    SMALLCNN_E2E.build(folder)
    text_pipeline(folder, TEXT, SMALL_BERT)
    return folder


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with serving(root) as running:
        yield running


@pytest.fixture(scope="module")
def pictures() -> tuple[np.ndarray, np.ndarray]:
    return synthetic_pixels(IMAGES, IMAGES_SEED)


def infer(server: LocalServer, protocol: str, model: str, inputs: dict[str, np.ndarray]) -> Any:
    """One request with tritonclient; the result object (as_numpy by output name)."""
    lib: Any = th if protocol == "http" else tg
    url = server.http_url if protocol == "http" else server.grpc_url
    client = lib.InferenceServerClient(url)
    tensors = []
    for name, array in inputs.items():
        datatype = (
            "BYTES"
            if array.dtype == object
            else {"float32": "FP32", "int64": "INT64"}[str(array.dtype)]
        )
        tensor = lib.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    try:
        return client.infer(model, tensors)
    finally:
        client.close()


def column(items: list[bytes]) -> np.ndarray:
    return np.array([[i] for i in items], dtype=object)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_jpegs_get_the_top5_of_the_classifier_called_directly(
    server: LocalServer, protocol: str, pictures: tuple[np.ndarray, np.ndarray]
) -> None:
    pixels, classes = pictures
    jpegs = [encode_jpeg(p) for p in pixels]
    labels = infer(server, protocol, "smallcnn-e2e", {"image": column(jpegs)}).as_numpy("labels")
    assert labels.shape == (IMAGES, 5)
    assert labels[0, 0].decode().endswith(f":{classes[0]}:pattern-{classes[0]:02d}")
    got = top_indices(labels)
    # Decoded by hand (full-size decode, Pillow resize, whole-pixel crop), then the classifier.
    by_hand = np.stack([reference_pixels(j) for j in jpegs])
    scores = infer(server, protocol, "smallcnn", {"input": by_hand}).as_numpy("output")
    assert [row[0] for row in got] == scores.argmax(axis=1).tolist() == classes.tolist()
    # Each model of the pipeline called in turn: the same five classes in the same order.
    steps = infer(server, protocol, "smallcnn-e2e-image", {"image": column(jpegs)})
    scores = infer(server, protocol, "smallcnn", {"input": steps.as_numpy("pixels")})
    assert got == np.argsort(-scores.as_numpy("output"), axis=1, kind="stable")[:, :5].tolist()


def test_png_is_classified_as_its_jpeg(
    server: LocalServer, pictures: tuple[np.ndarray, np.ndarray]
) -> None:
    pixels, classes = pictures
    data = column([png(pixels[0]), encode_jpeg(pixels[0])])
    labels = infer(server, "http", "smallcnn-e2e", {"image": data}).as_numpy("labels")
    assert top_indices(labels)[0][0] == top_indices(labels)[1][0] == classes[0]


@pytest.mark.parametrize(
    ("bad", "status", "words"),
    [
        (b"GIF89a? no, plain text", "400", "not an image in a known format"),
        (b"truncated", "400", "not a decodable JPEG"),
        (png_bomb(8000), "413", "refused before decoding"),
        (jpeg_bomb(60000), "413", "refused before decoding"),
    ],
    ids=["text", "truncated-jpeg", "png-bomb", "jpeg-bomb"],
)
def test_a_bad_image_fails_alone_among_good_ones(
    server: LocalServer,
    pictures: tuple[np.ndarray, np.ndarray],
    bad: bytes,
    status: str,
    words: str,
) -> None:
    pixels, classes = pictures
    good = encode_jpeg(pixels[1])
    if bad == b"truncated":
        bad = good[: len(good) // 3]

    def send(image: bytes) -> Any:
        try:
            return infer(server, "http", "smallcnn-e2e", {"image": column([image])})
        except InferenceServerException as exc:
            return exc

    # Sent at once, so that the image step's batcher may put them in one batch.
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, [good, bad, good, good, bad, good]))
    for i in (1, 4):
        error = answers[i]
        assert isinstance(error, InferenceServerException), error
        assert error.status() == status and words in str(error) and "step 1" in str(error)
    for i in (0, 2, 3, 5):
        assert top_indices(answers[i].as_numpy("labels"))[0][0] == classes[1]
    with pytest.raises(InferenceServerException, match=words) as remote:
        infer(server, "grpc", "smallcnn-e2e", {"image": column([bad])})
    expected = "INVALID_ARGUMENT" if status == "400" else "RESOURCE_EXHAUSTED"
    assert remote.value.status() == f"StatusCode.{expected}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_text_gets_the_class_of_the_classifier_called_directly(
    server: LocalServer, root: Path, protocol: str
) -> None:
    texts, topics = sentences(8, seed=123)
    answer = infer(server, protocol, TEXT, {"text": column([t.encode() for t in texts])})
    got = [item.decode().split(":")[2] for item in answer.as_numpy("class").ravel()]
    tokenizer = root / f"{TEXT}-tokenizer" / "1" / "tokenizer.json"
    tokens = tokenize(tokenizer.read_text(), texts)
    logits = infer(server, protocol, f"{TEXT}-classifier", tokens).as_numpy("logits")
    assert got == [CLASSES[i] for i in logits.argmax(axis=1)]
    assert sum(g == CLASSES[t] for g, t in zip(got, topics, strict=True)) >= 6


def test_text_that_is_not_utf8_fails_alone(server: LocalServer) -> None:
    texts = [b"the striker scored", b"caf\xe9", b"the oven baked the dough"]

    def send(text: bytes) -> Any:
        try:
            return infer(server, "http", TEXT, {"text": column([text])})
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(send, texts))
    assert isinstance(answers[1], InferenceServerException)
    assert answers[1].status() == "400" and "not UTF-8" in str(answers[1])
    together = infer(server, "http", TEXT, {"text": column([texts[0], texts[2]])})
    np.testing.assert_array_equal(
        np.concatenate([answers[0].as_numpy("class"), answers[2].as_numpy("class")]),
        together.as_numpy("class"),
    )


def test_the_pipeline_is_built_with_its_parts(root: Path) -> None:
    pipeline = SMALLCNN_E2E
    for part in (pipeline.name, *pipeline.parts):
        assert (root / part / "config.toml").is_file(), part
    assert (root / "smallcnn-e2e-topk" / "1" / "model.topk").is_file()
    labels = (root / "smallcnn-e2e-topk" / "1" / "labels.txt").read_text().splitlines()
    assert labels[:2] == ["pattern-00", "pattern-01"] and len(labels) == 32
    assert all(r.error is None for r in ModelRepository(root).check())
    assert list(ZOO) == ["identity", "mlp", "digits", "resnet50", "bert-base"]  # unchanged


def test_zoo_list_shows_every_entry(root: Path) -> None:
    listed = run_cli("zoo", "list", "--dir", str(root))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if "│" in line}
    assert set(ZOO) | set(PIPELINES) | set(DECODERS) | set(TF_MODELS) <= set(rows)
    assert "(tensorflow)" in rows["tf-text"] and "input_ids INT64 [32]" in rows["tf-text"]
    assert "image BYTES [1]" in rows["smallcnn-e2e"] and "labels BYTES [5]" in rows["smallcnn-e2e"]
    assert "not built" in rows["resnet50"] and "M /" in rows["smallcnn-e2e"]
    assert "text generation" in rows["llama-tiny"] and "text_input BYTES [1]" in rows["llama-tiny"]
