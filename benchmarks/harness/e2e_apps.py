"""The JPEG -> top-5 pipeline written the natural way, for the peers of benchmarks/e2e_pipeline.py.

The same work as dlscale's zoo pipeline (smallcnn-e2e), read from the same repository: each JPEG
decoded, resized and centre-cropped by the same function as dlscale's image step (libjpeg-turbo
through simplejpeg, Pillow; `dlscale.backends.processing.decode.decode_rgb`, which imports
nothing of the server), normalized to NCHW FP32, the same ONNX file run by ONNX Runtime with
the same session options, and the top 5 written as Triton's classification strings
("score:index:label"). The peers differ only in how they serve it, which is what is measured.

This module imports numpy and the standard library at the top only, so that PyTriton's own
virtual environment (which has no dlscale dependencies) can load it with `src` on its path.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PIPELINE = "smallcnn-e2e"
IMAGE_STEP = f"{PIPELINE}-image"
MODEL = "smallcnn"
TOPK_STEP = f"{PIPELINE}-topk"
TOP_K = 5
#: The pipeline's and every step's largest batch, and how long a step waits for company: the
#: zoo's (models/zoo/e2e.py, steps.py), given to the peers' batchers alike.
MAX_BATCH = 64
QUEUE_DELAY_US = 200


@dataclass(frozen=True)
class E2ESpec:
    """What the pipeline does, read from dlscale's repository so that every server agrees."""

    model: Path
    resize: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    labels: tuple[str, ...]

    @classmethod
    def read(cls, repo: Path) -> E2ESpec:
        image = tomllib.loads((repo / IMAGE_STEP / "config.toml").read_text())["backend_options"]
        labels = (repo / TOPK_STEP / "1" / "labels.txt").read_text().splitlines()
        return cls(
            model=repo / MODEL / "1" / "model.onnx",
            resize=int(image["resize"]),
            crop=int(image["crop"]),
            mean=tuple(image["mean"]),
            std=tuple(image["std"]),
            labels=tuple(labels),
        )


class Classifier:
    """decode(jpeg) -> pixels; classify(batch of pixels) -> top-5 strings per row."""

    def __init__(self, spec: E2ESpec) -> None:
        import onnxruntime as ort

        from dlscale.backends.processing.decode import Geometry

        self.spec = spec
        self.geometry = Geometry(spec.resize, (spec.crop, spec.crop), 16 << 20, 40_000_000)
        mean = np.asarray(spec.mean, np.float32).reshape(3, 1, 1)
        std = np.asarray(spec.std, np.float32).reshape(3, 1, 1)
        self.gain = 1.0 / (255.0 * std)
        self.offset = -mean / std
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(spec.model), options, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name

    def decode(self, jpeg: bytes) -> np.ndarray:
        """One JPEG as FP32 [3, crop, crop], normalized."""
        from dlscale.backends.processing.decode import decode_rgb

        rgb = decode_rgb(jpeg, self.geometry)
        pixels: np.ndarray = rgb.transpose(2, 0, 1) * self.gain + self.offset
        return pixels.astype(np.float32, copy=False)

    def scores(self, pixels: np.ndarray) -> np.ndarray:
        """The model's scores for a batch FP32 [n, 3, crop, crop]."""
        out: np.ndarray = self.session.run(None, {self.input_name: pixels})[0]
        return out

    def top(self, scores: np.ndarray) -> np.ndarray:
        """BYTES [n, 5]: "score:index:label", highest first."""
        order = np.argsort(-scores.astype(np.float64), axis=1, kind="stable")[:, :TOP_K]
        out = np.empty(order.shape, object)
        for r, row in enumerate(order):
            for c, k in enumerate(row):
                out[r, c] = f"{scores[r, k]:f}:{k}:{self.spec.labels[k]}".encode()
        return out

    def classify(self, pixels: np.ndarray) -> np.ndarray:
        """Scores and top 5 of a batch."""
        return self.top(self.scores(pixels))

    def run(self, jpegs: list[bytes]) -> np.ndarray:
        """The whole pipeline on a batch of JPEGs, in the calling thread."""
        return self.classify(np.stack([self.decode(j) for j in jpegs]))


def element(value: Any) -> bytes:
    """A BYTES element as the peers hand it over (bytes, or numpy's bytes_)."""
    return bytes(value)
