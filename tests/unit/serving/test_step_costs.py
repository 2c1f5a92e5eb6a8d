"""What a pipeline step costs beyond its compute, cut without losing what a step guarantees:
small top-k batches computed on the event loop still count their statistics and fail only their
own requests; a chain of steps runs in the request's task, a DAG's branches still concurrently."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.pipelines import pipeline_repository

from dlscale.backends import create_backend
from dlscale.backends.base import BackendOptions
from dlscale.backends.processing.topk import TopKBackend
from dlscale.errors import InvalidInput
from dlscale.models.config import StepConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.host import HostPlane
from dlscale.serving.instance import Instance
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.pipeline import _is_chain
from dlscale.serving.policy import BatchPolicy
from dlscale.types import Datatype, TensorSpec

CLASSES = 10


class WhereTopK(TopKBackend):
    """The real top-k step, noting the thread each batch ran in."""

    threads: list[str]

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        return super().infer(inputs)


def _topk(tmp_path: Path, classes: int) -> WhereTopK:
    (tmp_path / "labels.txt").write_text("".join(f"c{i}\n" for i in range(CLASSES)))
    options = BackendOptions(
        max_batch_size=64, inputs=(TensorSpec("scores", Datatype.FP32, (-1, classes)),)
    )
    backend = WhereTopK(tmp_path / "model.topk", options)
    backend.threads = []
    return backend


def test_topk_takes_small_batches_inline_within_its_budget(tmp_path: Path) -> None:
    few = _topk(tmp_path, CLASSES).capabilities.inline_rows
    many = _topk(tmp_path, 1000).capabilities.inline_rows
    assert few > many >= 1
    assert _topk(tmp_path, 100_000).capabilities.inline_rows == 0  # no row is cheap enough
    unknown = create_backend("topk", tmp_path / "model.topk", BackendOptions(max_batch_size=8))
    assert unknown.capabilities.inline_rows == 0  # scores of any width: always the thread


async def test_an_inline_batch_counts_its_statistics_and_fails_only_its_requests(
    tmp_path: Path,
) -> None:
    backend = _topk(tmp_path, CLASSES)
    instance = Instance(backend, "topk-instance")
    await instance.load()
    inline = instance.inline.rows
    assert inline >= 2
    stats = ModelStats("topk", "1")
    batcher = Batcher(BatchPolicy(64), [instance], stats)
    batcher.start()
    scores = np.arange(CLASSES, dtype=np.float32)
    try:
        small = await batcher.infer({"scores": np.stack([scores, -scores])})
        big = await batcher.infer({"scores": np.tile(scores, (inline + 1, 1))})
        # A batch whose rows are too short for k: its requests fail, the next batch is served.
        with pytest.raises(InvalidInput, match="at least k = 5 scores"):
            await batcher.infer({"scores": np.zeros((1, 3), np.float32)})
        after = await batcher.infer({"scores": scores[None]})
    finally:
        await batcher.close()
        await instance.close()
    assert small["labels"][0][0] == b"9.000000:9:c9" and small["labels"][1][0].endswith(b":0:c0")
    assert len(big["labels"]) == inline + 1 and after["labels"][0][0].startswith(b"9.0")
    main = threading.current_thread().name
    assert backend.threads[0] == main  # 2 rows: on the event loop
    assert backend.threads[1].startswith("topk-instance")  # above inline_rows: its thread
    assert backend.threads[2] == backend.threads[3] == main
    snapshot = stats.snapshot()
    assert snapshot.execution_count == 3  # the failed batch is no execution
    sizes = {b.batch_size: b.compute_infer.count for b in snapshot.batch_stats}
    assert sizes == {2: 1, inline + 1: 1, 1: 1}  # the inline ones timed as the thread's


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> StepConfig:
    return StepConfig(model=model, input_map=inputs, output_map=outputs)


def test_only_a_chain_runs_its_steps_in_turn() -> None:
    a = _step("a", {"x": "IN"}, {"y": "A"})
    b = _step("b", {"x": "A"}, {"y": "B"})
    c = _step("c", {"x": "A", "z": "IN"}, {"y": "C"})
    assert _is_chain((a, b), {"IN"})
    assert _is_chain((a, c), {"IN"})  # a pipeline input beside the previous step's output
    assert not _is_chain((b, a), {"IN"})  # listed out of order: the DAG path orders them
    assert not _is_chain((a, b, c), {"IN"})  # b and c could run at once
    assert not _is_chain((a, _step("d", {"x": "IN"}, {"y": "D"})), {"IN"})


async def test_served_pipelines_say_whether_they_are_chains(tmp_path: Path) -> None:
    plane = HostPlane(ModelManager.open(pipeline_repository(tmp_path)), "explicit")
    try:
        for name, chained in (("chain", True), ("breaks", True), ("diamond", False)):
            await plane.load_model(name)
            pipeline = plane.manager.get(name).runner.pipeline
            assert pipeline is not None and pipeline.chained is chained, name
    finally:
        await plane.manager.close()
