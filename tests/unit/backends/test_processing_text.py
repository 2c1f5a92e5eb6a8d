"""The tokenizer and top-k steps against the libraries called by hand, and their refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.processing.tokenizer import TokenizerBackend
from dlscale.backends.processing.topk import TopKBackend
from dlscale.errors import ConfigError, InvalidInput, PayloadTooLarge
from dlscale.models.zoo.text import sentences, train_tokenizer
from dlscale.types import Datatype, TensorSpec
from dlscale.wire.classification import top_classes

LENGTH = 16


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    path.write_text(train_tokenizer(LENGTH))
    return path


def tokenizer_step(path: Path, **options: Any) -> TokenizerBackend:
    backend = create_backend(
        "tokenizer", path, BackendOptions(max_batch_size=8, extra={"max_length": LENGTH, **options})
    )
    assert isinstance(backend, TokenizerBackend)
    backend.load()
    return backend


def texts(*items: bytes) -> dict[str, np.ndarray]:
    return {"text": np.array([[t] for t in items], dtype=object)}


def test_tokens_are_the_tokenizers_own(vocabulary: Path) -> None:
    step = tokenizer_step(vocabulary, token_type_ids=True)
    corpus = sentences(5, seed=3)[0] + ["a sentence far longer than sixteen tokens " * 4]
    out = step.infer(texts(*(t.encode() for t in corpus)))
    reference = Tokenizer.from_file(str(vocabulary)).encode_batch(corpus)
    np.testing.assert_array_equal(out["input_ids"], [e.ids for e in reference])
    np.testing.assert_array_equal(out["attention_mask"], [e.attention_mask for e in reference])
    assert out["input_ids"].shape == (6, LENGTH) and out["input_ids"].dtype == np.int64
    assert out["attention_mask"][-1].all()  # truncated to LENGTH, no padding left
    assert not out["token_type_ids"].any()
    assert [s.name for s in step.outputs] == ["input_ids", "attention_mask", "token_type_ids"]


def test_bad_text_fails_its_own_request(vocabulary: Path) -> None:
    step = tokenizer_step(vocabulary, max_bytes=64)
    good = texts(b"the striker scored")
    results = step.infer_requests([good, texts(b"ok", b"caf\xe9 au lait"), texts(b"x" * 65), good])
    assert isinstance(results[1], InvalidInput)
    assert "row 1" in str(results[1]) and "not UTF-8" in str(results[1])
    assert isinstance(results[2], PayloadTooLarge) and "max_bytes (64)" in str(results[2])
    alone = step.infer(good)
    for result in (results[0], results[3]):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["input_ids"], alone["input_ids"])


def test_tokenizer_refusals(vocabulary: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_lenght"):
        tokenizer_step(vocabulary, max_lenght=8)
    with pytest.raises(ConfigError, match="no padding token"):
        tokenizer_step(vocabulary, pad_token="<pad>")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        tokenizer_step(broken)


def topk_step(tmp_path: Path, label_text: str | None, **options: Any) -> TopKBackend:
    if label_text is not None:
        (tmp_path / "labels.txt").write_text(label_text)
    backend = create_backend(
        "topk", tmp_path / "model.topk", BackendOptions(max_batch_size=8, extra=options)
    )
    assert isinstance(backend, TopKBackend)
    backend.load()
    return backend


def test_topk_is_tritons_classification_format(tmp_path: Path) -> None:
    step = topk_step(tmp_path, "cat\ndog\nbird\nfish\n", k=3)
    scores = np.array([[0.1, 0.9, 0.5, 0.2], [3.0, 1.0, 2.0, 3.0]], np.float32)
    out = step.infer({"scores": scores})
    np.testing.assert_array_equal(
        out["labels"], top_classes(scores, 3, ["cat", "dog", "bird", "fish"], True, "scores")
    )
    assert out["labels"][0, 0] == b"0.900000:1:dog"
    np.testing.assert_array_equal(out["indices"], [[1, 2, 3], [0, 3, 2]])  # ties: lower index first


def test_topk_refusals(tmp_path: Path) -> None:
    step = topk_step(tmp_path, "a\nb\n", k=3)
    with pytest.raises(InvalidInput, match="at least k = 3 scores"):
        step.infer({"scores": np.zeros((2, 2), np.float32)})
    with pytest.raises(ConfigError, match="labels file cannot be read"):
        topk_step(tmp_path / "missing", None, labels="nowhere.txt")
    with pytest.raises(ConfigError, match="labels file cannot be read"):
        topk_step(tmp_path, None, labels="../../etc/passwd")
    wrong = BackendOptions(max_batch_size=8, outputs=(TensorSpec("top", Datatype.FP32, (-1, 5)),))
    with pytest.raises(ConfigError, match="outputs are BYTES"):
        TopKBackend(tmp_path / "model.topk", wrong)
    few = BackendOptions(
        max_batch_size=8, extra={"k": 5}, inputs=(TensorSpec("s", Datatype.FP32, (-1, 3)),)
    )
    with pytest.raises(ConfigError, match="k = 5 is more than the 3 scores"):
        TopKBackend(tmp_path / "model.topk", few)
