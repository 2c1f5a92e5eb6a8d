"""The benchmark's models and their request bodies, written once for every server.

`identity` and `mlp` are built here with onnx.helper (small, deterministic); `resnet50` comes from
the zoo when the zoo is installed. The same model file and the same batching knobs go to dlscale
(config.toml) and to MLServer (model-settings.json, see peers.py). The large-tensor benchmarks
share `build_image_repository` (identity over images) and `build_large_repository`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class BenchModel:
    """A model as the benchmark serves it: file, input, batching knobs."""

    name: str
    input_name: str
    output_name: str
    row_shape: tuple[int, ...]
    max_batch_size: int
    max_queue_delay_us: int
    intra_op_threads: int = 1

    def path(self, root: Path) -> Path:
        """Where its ONNX file lies in a repository folder."""
        return root / self.name / "1" / "model.onnx"

    def rows(self, n: int, seed: int = 0) -> np.ndarray:
        """`n` rows of deterministic input."""
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, *self.row_shape)).astype(np.float32)

    def json_body(self, rows: int = 1) -> bytes:
        """An inference request with the input as JSON numbers."""
        x = self.rows(rows)
        tensor = {
            "name": self.input_name,
            "shape": list(x.shape),
            "datatype": "FP32",
            "data": x.reshape(-1).tolist(),
        }
        return json.dumps({"inputs": [tensor]}).encode()

    def binary_body(self, rows: int = 1) -> tuple[bytes, dict[str, str]]:
        """An inference request with the input, and the output asked for, as binary data."""
        x = self.rows(rows)
        header = {
            "inputs": [
                {
                    "name": self.input_name,
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": self.output_name, "parameters": {"binary_data": True}}],
        }
        head = json.dumps(header).encode()
        return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


IDENTITY = BenchModel("identity", "input", "output", (16,), 32, 500)
MLP = BenchModel("mlp", "input", "output", (256,), 32, 500)
RESNET50 = BenchModel("resnet50", "input", "output", (3, 224, 224), 16, 2000, intra_op_threads=2)


def _save(model_path: Path, graph: onnx.GraphProto) -> None:
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, model_path)


def build_identity(root: Path) -> None:
    """FP32 [N,16] returned unchanged."""
    build_identity_like(root, IDENTITY)


def build_identity_like(root: Path, model: BenchModel) -> None:
    """An ONNX Identity over FP32 [N, *model.row_shape], saved where `model` lies in `root`."""
    dims: list[str | int] = ["N", *model.row_shape]
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, dims)
        for n in (model.input_name, model.output_name)
    ]
    node = helper.make_node("Identity", [model.input_name], [model.output_name])
    _save(model.path(root), helper.make_graph([node], model.name, [io[0]], [io[1]]))


def build_mlp(root: Path) -> None:
    """256-1024-10 with ReLU, seeded weights."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((256, 1024)) / 16).astype(np.float32)
    w2 = (rng.standard_normal((1024, 10)) / 32).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["output"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    _save(MLP.path(root), graph)


def build_resnet50(root: Path) -> bool:
    """ResNet-50 from dlscale's zoo; False when the zoo (or torch, which builds it) is missing."""
    try:
        from dlscale.models.zoo import build_zoo
    except ImportError:
        return False
    if not RESNET50.path(root).is_file():
        build_zoo(root, ["resnet50"])
    return True


def write_dlscale_config(root: Path, model: BenchModel) -> None:
    """config.toml with the benchmark's batching knobs and one instance."""
    (root / model.name / "config.toml").write_text(
        f'name = "{model.name}"\n'
        f"max_batch_size = {model.max_batch_size}\n"
        "[batching]\n"
        f"max_queue_delay_us = {model.max_queue_delay_us}\n"
        "[backend_options]\n"
        f"intra_op_threads = {model.intra_op_threads}\n"
        "inter_op_threads = 1\n"
    )


# -- identity over images: the shared-memory and large-tensor benchmarks --------------------------

#: identity FP32 over [N, 3, 224, 224] (19 MB at 32 rows) and over [N, 16].
LARGE = BenchModel("identity", "input", "output", (3, 224, 224), 32, 500)
SMALL = BenchModel("identity16", "input", "output", (16,), 32, 500)


def build_image_repository(root: Path, resnet: bool) -> Path:
    """identity over images, and the zoo's resnet50, with the same knobs Triton gets."""
    build_identity_like(root, LARGE)
    write_dlscale_config(root, LARGE)
    if resnet and build_resnet50(root):
        # Triton's knobs in benchmarks/pytriton_server.py, not the REST benchmark's RESNET50.
        write_dlscale_config(root, replace(RESNET50, max_batch_size=32, max_queue_delay_us=500))
    return root


def build_large_repository(root: Path) -> Path:
    """identity over images (one intra-op thread) and identity over [N, 16]."""
    build_image_repository(root, resnet=False)
    build_identity_like(root, SMALL)
    write_dlscale_config(root, SMALL)
    return root


def mlp_copies(scratch: Path, count: int) -> tuple[Path, list[str]]:
    """A repository of `count` copies of the MLP under names of their own (the many-models
    benchmarks), and its names in order."""
    # Imported here: small_inprocess's children import this module with an older revision's
    # `dlscale` on the path, which may predate multimodel_run.
    from dlscale.bench.multimodel_run import copies

    source = scratch / "source"
    build_mlp(source)
    write_dlscale_config(source, MLP)
    repo = copies(source, MLP.name, count, scratch / "repo")
    return repo, sorted(p.name for p in repo.iterdir())
