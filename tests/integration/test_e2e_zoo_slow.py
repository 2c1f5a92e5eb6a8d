"""The zoo's full-size end-to-end entries, resnet50-e2e and bert-e2e (BERT-base), built and
served as a user would, against decoding or tokenizing in the test and calling the classifier
directly. Slow: the two classifiers take 1-2 minutes to build on 2 cores."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.toolkit.images import reference_pixels, top_indices
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.slow import slow_only

from dlscale.models.zoo import PIPELINES
from dlscale.models.zoo.e2e_text import tokenize
from dlscale.models.zoo.jpegs import synthetic_jpegs
from dlscale.models.zoo.text import CLASSES, sentences

pytestmark = [
    pytest.mark.slow,
    slow_only("builds resnet50-e2e and bert-e2e (BERT-base): 1-2 min on 2 cores"),
]


@pytest.fixture(scope="module")
def root(big_zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("e2e_zoo")
    shutil.copytree(big_zoo / "resnet50", folder / "resnet50")  # reused by resnet50-e2e
    for name in ("resnet50-e2e", "bert-e2e"):
        PIPELINES[name].build(folder)
    return folder


@pytest.fixture(scope="module")
def client(root: Path) -> Iterator[tg.InferenceServerClient]:
    running: LocalServer
    with serving(root) as running:
        yield tg.InferenceServerClient(running.grpc_url)


def call(client: tg.InferenceServerClient, model: str, **arrays: np.ndarray) -> tg.InferResult:
    tensors = []
    for name, array in arrays.items():
        datatype = (
            "BYTES" if array.dtype == object else "FP32" if array.dtype == np.float32 else "INT64"
        )
        tensor = tg.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors)


def test_resnet50_e2e_agrees_with_resnet50_on_a_hand_decode(
    client: tg.InferenceServerClient,
) -> None:
    jpegs = synthetic_jpegs(4, seed=31)
    images = np.array([[j] for j in jpegs], dtype=object)
    labels = call(client, "resnet50-e2e", image=images).as_numpy("labels")
    by_hand = np.stack([reference_pixels(j, 256, 224) for j in jpegs])
    scores = call(client, "resnet50", input=by_hand).as_numpy("output")
    assert [row[0] for row in top_indices(labels)] == scores.argmax(axis=1).tolist()


def test_bert_e2e_agrees_with_its_classifier(client: tg.InferenceServerClient, root: Path) -> None:
    texts, topics = sentences(8, seed=41)
    answer = call(client, "bert-e2e", text=np.array([[t.encode()] for t in texts], dtype=object))
    got = [item.decode().split(":")[2] for item in answer.as_numpy("class").ravel()]
    tokenizer = (root / "bert-e2e-tokenizer" / "1" / "tokenizer.json").read_text()
    logits = call(client, "bert-e2e-classifier", **tokenize(tokenizer, texts)).as_numpy("logits")
    assert got == [CLASSES[i] for i in logits.argmax(axis=1)]
    assert sum(g == CLASSES[t] for g, t in zip(got, topics, strict=True)) >= 6
