"""The zoo's end-to-end entries: the synthetic JPEG set, the CUDA variant of the image
pipelines' folders, and `zoo images` (a built pipeline and `zoo list`: test_e2e_pipelines.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import simplejpeg
from tests.toolkit.cli import run_cli
from tokenizers import Tokenizer

from dlscale.models.zoo.e2e import SMALLCNN, image_pipeline
from dlscale.models.zoo.jpegs import synthetic_jpegs, synthetic_pixels
from dlscale.models.zoo.text import SPECIAL_TOKENS, train_tokenizer


def test_synthetic_jpegs_are_photos_of_the_synthetic_classes() -> None:
    jpegs = synthetic_jpegs(3, seed=5)
    assert jpegs == synthetic_jpegs(3, seed=5) and jpegs != synthetic_jpegs(3, seed=6)
    pixels, classes = synthetic_pixels(3, seed=5)
    for data, image in zip(jpegs, pixels, strict=True):
        assert simplejpeg.decode_jpeg_header(data)[:2] == (375, 500)
        decoded = simplejpeg.decode_jpeg(data, colorspace="RGB").astype(np.int16)
        assert np.abs(decoded - image).mean() < 3  # quality 90
    assert classes.dtype == np.int64 and len(classes) == 3
    small = synthetic_jpegs(1, seed=0, size=(48, 64))[0]
    assert simplejpeg.decode_jpeg_header(small)[:2] == (48, 64)


def test_the_cuda_variant_keeps_pixels_on_the_device(tmp_path: Path) -> None:
    image_pipeline(tmp_path, "cnn-gpu", SMALLCNN, 73, 64, device="cuda:1")
    image = tomllib.loads((tmp_path / "cnn-gpu-image" / "config.toml").read_text())
    assert image["instances"] == [{"count": 1, "device": "cuda:1"}]
    assert image["backend_options"]["device_output"] is True
    classifier = tmp_path / "cnn-gpu-classifier"
    config = tomllib.loads((classifier / "config.toml").read_text())
    assert config["backend"] == "torch" and config["instances"][0]["device"] == "cuda:1"
    assert sorted(p.name for p in (classifier / "1").iterdir()) == ["model.zoo"]
    steps = tomllib.loads((tmp_path / "cnn-gpu" / "config.toml").read_text())["steps"]
    assert [s["model"] for s in steps] == ["cnn-gpu-image", "cnn-gpu-classifier", "cnn-gpu-topk"]


def test_zoo_images_writes_the_set(tmp_path: Path) -> None:
    written = run_cli("zoo", "images", "--out", str(tmp_path / "jpegs"), "--count", "2")
    assert written.returncode == 0, written.stderr
    files = sorted((tmp_path / "jpegs").iterdir())
    assert [f.name for f in files] == ["00000.jpg", "00001.jpg"]
    assert [f.read_bytes() for f in files] == synthetic_jpegs(2)


def test_the_text_tokenizer_is_the_same_on_every_build() -> None:
    # tokenizers' WordPiece trainer learnt another vocabulary on nearly every build (its
    # issue #1794): bert-e2e's tokenizer.json and classifier changed from build to build.
    built = {train_tokenizer(16) for _ in range(4)}
    assert len(built) == 1
    tokenizer = Tokenizer.from_str(built.pop())
    # The "##x" pieces named to fix their numbering stay ordinary pieces, not special tokens.
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    assert specials == list(SPECIAL_TOKENS)
    encoded = tokenizer.encode("networks ##e")  # '#' is in no sentence: unknown
    assert encoded.tokens[:6] == ["[CLS]", "network", "##s", "[UNK]", "[UNK]", "e"]
    assert tokenizer.decode(encoded.ids) == "networks e"
