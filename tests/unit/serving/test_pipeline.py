"""Pipelines through the real manager, DataPlane and step batchers: loading with their steps,
the DAG, errors that name the step, priority and timeout carried through every step."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.pipelines import (
    diamond,
    pipeline_repository,
    pipeline_toml,
    step,
    write_pipeline,
)

from dlscale.errors import BackendError, ConfigError, InvalidInput, TimedOut
from dlscale.serving.control.poller import RepositoryPoller
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.trace import Tracer, TraceSettings
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.serving.regions.system import shm_path
from dlscale.serving.served import ModelState
from dlscale.types import Datatype, InferenceRequest, RegionRef, RegionTensor

X = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[HostPlane]:
    """A plane over the pipeline repository with nothing loaded yet."""
    host = HostPlane(ModelManager.open(pipeline_repository(tmp_path)), "explicit")
    yield host
    await host.manager.close()


def _state(plane: HostPlane, name: str) -> ModelState | None:
    entry = next((e for e in plane.manager.entries() if e.name == name), None)
    return entry.state if entry else None


async def test_a_pipeline_loads_the_models_it_uses_and_runs_them_in_order(
    plane: HostPlane,
) -> None:
    await plane.load_model("chain")
    assert _state(plane, "add_one") is _state(plane, "copy") is ModelState.READY
    answer = await plane.infer(InferenceRequest("chain", {"RAW": X}, id="r1"))
    np.testing.assert_array_equal(answer.outputs["RESULT"], X + 1)
    assert answer.model_name == "chain" and answer.id == "r1"
    metadata = plane.model_metadata("chain")
    assert metadata.platform == "ensemble" and metadata.versions == ("1",)


async def test_parallel_branches_join_and_each_step_counts_its_own_requests(
    plane: HostPlane,
) -> None:
    await plane.load_model("diamond")
    answers = await asyncio.gather(
        *(plane.infer(InferenceRequest("diamond", {"RAW": X + i})) for i in range(4))
    )
    for i, answer in enumerate(answers):
        for name, expected in diamond(X + i).items():
            np.testing.assert_array_equal(answer.outputs[name], expected)
    for model in ("diamond", "add_one", "double", "copy", "join"):
        (stats,) = plane.statistics(model)
        assert stats.inference_stats.success.count == 4, model
        assert stats.inference_count == 4 * len(X), model
    # The pipeline runs nothing itself: its steps' batchers do.
    (pipeline,) = plane.statistics("diamond")
    assert pipeline.execution_count == 0


async def test_a_steps_error_names_the_step_and_keeps_its_class(plane: HostPlane) -> None:
    await plane.load_model("breaks")
    ok = await plane.infer(InferenceRequest("breaks", {"x": X}))
    np.testing.assert_array_equal(ok.outputs["y"], X + 1)
    with pytest.raises(BackendError, match=r"in pipeline 'breaks', step 2 \(model 'evens'\)"):
        await plane.infer(InferenceRequest("breaks", {"x": X[:2]}))
    (stats,) = plane.statistics("breaks")
    assert stats.inference_stats.fail.count == 1
    # A row the pipeline accepts but its first step does not: the client's mistake, a 4xx.
    await plane.load_model("chain")
    with pytest.raises(InvalidInput, match=r"step 1 \(model 'add_one'\).*shape") as caught:
        await plane.infer(InferenceRequest("chain", {"RAW": X[:, :3]}))
    assert caught.value.http_status == 400


async def test_malformed_inputs_are_refused_before_any_step_runs(plane: HostPlane) -> None:
    await plane.load_model("chain")
    bad = [
        {"RAW": X.astype(np.int32)},
        {"OTHER": X},
        {"RAW": np.zeros((9, 4), np.float32)},  # above the pipeline's max_batch_size
    ]
    for inputs in bad:
        with pytest.raises(InvalidInput, match="'chain'"):
            await plane.infer(InferenceRequest("chain", inputs))
    (add_one,) = plane.statistics("add_one")
    assert add_one.inference_stats.success.count + add_one.inference_stats.fail.count == 0


async def test_a_missing_step_refuses_the_load_and_keeps_the_server_not_ready(
    tmp_path: Path,
) -> None:
    lonely = pipeline_toml(
        0, ["x"], ["y"], [step("absent", {"INPUT0": "x"}, {"OUTPUT0": "y"})]
    ).replace("max_batch_size = 0\n", "")
    write_pipeline(tmp_path, "orphan", lonely)
    plane = HostPlane(ModelManager.open(tmp_path), "explicit")
    failed = await plane.load_initial()
    assert "'absent'" in str(failed["orphan"]) and "neither loaded nor in" in str(failed["orphan"])
    assert not await plane.ready() and not await plane.model_ready("orphan")
    (row,) = plane.repository_index()
    assert row.state == "UNAVAILABLE" and "'absent'" in row.reason


async def test_pipelines_that_use_each_other_are_refused(tmp_path: Path) -> None:
    for name, other in (("loop_a", "loop_b"), ("loop_b", "loop_a")):
        steps = [step(other, {"x": "x"}, {"y": "y"})]
        write_pipeline(tmp_path, name, pipeline_toml(0, ["x"], ["y"], steps))
    manager = ModelManager.open(tmp_path)
    with pytest.raises(ConfigError, match="uses itself: loop_a -> loop_b -> loop_a"):
        await manager.load("loop_a")
    await manager.close()


async def test_a_step_of_a_loaded_pipeline_is_not_unloaded_from_under_it(
    plane: HostPlane,
) -> None:
    await plane.load_model("chain")
    with pytest.raises(ConfigError, match=r"step of the loaded pipelines \['chain'\]"):
        await plane.unload_model("add_one")
    assert _state(plane, "add_one") is ModelState.READY
    await plane.unload_model("chain")
    await plane.unload_model("add_one")
    assert _state(plane, "add_one") is ModelState.UNAVAILABLE


async def test_a_pipeline_wider_than_a_batching_step_is_refused_at_load(tmp_path: Path) -> None:
    pipeline_repository(tmp_path)
    steps = [step("add_one", {"INPUT0": "x"}, {"OUTPUT0": "y"})]
    write_pipeline(tmp_path, "wide", pipeline_toml(16, ["x"], ["y"], steps))
    manager = ModelManager.open(tmp_path)
    with pytest.raises(ConfigError, match=r"step 1: model 'add_one' has max_batch_size 8, below"):
        await manager.load("wide")
    await manager.close()


async def test_the_config_view_shows_the_ensemble_scheduling(plane: HostPlane) -> None:
    await plane.load_model("chain")
    view = plane.model_config("chain")
    assert (view.platform, view.backend, view.max_batch_size) == ("ensemble", "", 8)
    assert view.dynamic_batching is None and view.instance_groups == ()
    assert [(s.model_name, s.model_version) for s in view.ensemble_steps] == [
        ("add_one", -1),
        ("copy", -1),
    ]
    assert view.ensemble_steps[1].input_map == {"INPUT0": "plus_one"}


async def test_a_deadline_that_runs_out_in_the_second_steps_queue_times_out(
    plane: HostPlane,
) -> None:
    await plane.load_model("urgent")
    # "slow" computes one row per batch for SLOW_US: the pipeline's second step waits behind it.
    busy = asyncio.ensure_future(plane.infer(InferenceRequest("slow", {"INPUT0": X[:1]})))
    await asyncio.sleep(0.05)
    late = InferenceRequest("urgent", {"x": X[:1]}, parameters={"timeout": 100_000})
    with pytest.raises(TimedOut, match=r"step 2 \(model 'slow'\).*timed out in the queue"):
        await plane.infer(late)
    await busy
    (first,) = plane.statistics("add_one")
    assert first.inference_stats.success.count == 1  # the first step ran within the deadline


async def test_the_requests_priority_carries_into_every_step(plane: HostPlane) -> None:
    await plane.load_model("urgent")
    busy = asyncio.ensure_future(plane.infer(InferenceRequest("slow", {"INPUT0": X[:1]})))
    await asyncio.sleep(0.05)
    low = asyncio.ensure_future(
        plane.infer(InferenceRequest("slow", {"INPUT0": X[1:2]}, parameters={"priority": 2}))
    )
    await asyncio.sleep(0.05)
    high = asyncio.ensure_future(
        plane.infer(InferenceRequest("urgent", {"x": X[2:3]}, parameters={"priority": 1}))
    )
    done, _ = await asyncio.wait({low, high}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {high}  # queued last at the slow step, served first
    np.testing.assert_array_equal(high.result().outputs["y"], X[2:3] + 1)
    await asyncio.gather(busy, low)


async def test_polling_unloads_a_vanished_pipeline_before_the_step_that_vanished_with_it(
    tmp_path: Path,
) -> None:
    root = pipeline_repository(tmp_path)
    for name in {p.name for p in root.iterdir()} - {"add_one", "copy", "chain"}:
        shutil.rmtree(root / name)
    manager = ModelManager.open(root)
    await manager.load_all()
    poller = RepositoryPoller(manager)
    poller.remember_loaded()
    for name in ("add_one", "chain"):
        shutil.rmtree(root / name)
    await poller.poll_once()
    states = {e.name: e.state for e in manager.entries()}
    assert states == {
        "add_one": ModelState.UNAVAILABLE,
        "chain": ModelState.UNAVAILABLE,
        "copy": ModelState.READY,
    }
    await manager.close()


async def test_under_load_each_step_merges_the_pipelines_requests_into_batches(
    tmp_path: Path,
) -> None:
    root = pipeline_repository(tmp_path)
    tensors = '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [4]\n'
    tensors += tensors.replace("inputs", "outputs").replace('"x"', '"y"')
    # 50 ms per batch: while one computes, the pipeline's next requests queue and merge.
    paused = "max_batch_size = 8\n[backend_options]\ndelay_us = 50000\n"
    write_null_model(root, "pause", paused + tensors)
    steps = [
        step("pause", {"x": "x"}, {"y": "mid"}),
        step("add_one", {"INPUT0": "mid"}, {"OUTPUT0": "y"}),
    ]
    write_pipeline(root, "paced", pipeline_toml(8, ["x"], ["y"], steps))
    plane = HostPlane(ModelManager.open(root), "explicit")
    await plane.load_model("paced")
    answers = await asyncio.gather(
        *(plane.infer(InferenceRequest("paced", {"x": X[:1] + i})) for i in range(12))
    )
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer.outputs["y"], X[:1] + i + 1)
    (pause,) = plane.statistics("pause")
    assert pause.inference_count == 12 and pause.execution_count < 12
    await plane.manager.close()


async def test_a_traced_pipeline_request_leaves_a_trace_per_step(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(path, TraceSettings("TIMESTAMPS", rate=1))
    manager = ModelManager.open(pipeline_repository(tmp_path / "repo"))
    plane = HostPlane(manager, "explicit", tracer=tracer)
    await plane.load_model("chain")
    await plane.infer(InferenceRequest("chain", {"RAW": X}, id="traced"))
    tracer.flush()
    headers = [t for t in json.loads(path.read_text()) if "model_name" in t]
    assert sorted(t["model_name"] for t in headers) == ["add_one", "chain", "copy"]
    assert {t["request_id"] for t in headers} == {"traced"}
    await manager.close()


async def test_a_priority_beyond_a_steps_levels_takes_its_default_and_beyond_all_is_refused(
    plane: HostPlane,
) -> None:
    await plane.load_model("urgent")  # add_one has one priority level, slow two
    low = InferenceRequest("urgent", {"x": X[:1]}, parameters={"priority": 2})
    np.testing.assert_array_equal((await plane.infer(low)).outputs["y"], X[:1] + 1)
    beyond = InferenceRequest("urgent", {"x": X[:1]}, parameters={"priority": 3})
    with pytest.raises(InvalidInput, match=r"priority 3 is out of range.*levels 1\.\.2"):
        await plane.infer(beyond)
    (first,) = plane.statistics("add_one")
    assert first.inference_stats.success.count == 1  # the refused request ran no step


async def test_a_pipeline_reads_its_input_from_a_shared_memory_region(tmp_path: Path) -> None:
    key = f"/dlscale-pipeline-{os.getpid()}"
    shm_path(key).write_bytes(X.tobytes())
    regions = SharedMemoryRegistry(enabled=True)
    manager = ModelManager.open(pipeline_repository(tmp_path))
    plane = HostPlane(manager, "explicit", shared_memory=regions)
    try:
        await plane.load_model("chain")
        regions.register_system("in", key, 0, X.nbytes)
        placed = RegionTensor(Datatype.FP32, X.shape, RegionRef("in", X.nbytes, 0))
        request = InferenceRequest("chain", {}, in_regions={"RAW": placed})
        answer = await plane.infer(request)
        np.testing.assert_array_equal(answer.outputs["RESULT"], X + 1)
    finally:
        regions.close()
        shm_path(key).unlink(missing_ok=True)
        await manager.close()


async def test_a_step_takes_an_earlier_steps_torch_output_and_checks_its_datatype(
    plane: HostPlane,
) -> None:
    """A step's output stays as its backend made it (a torch tensor, on the GPU a CUDA one): the
    next step, here a host model, gets it as a host array, and its datatype is still checked."""
    torch = pytest.importorskip("torch")
    from dlscale.serving.validation import check

    await plane.load_model("chain")
    answer = await plane._step(InferenceRequest("add_one", {"INPUT0": torch.from_numpy(X)}))
    np.testing.assert_array_equal(answer.outputs["OUTPUT0"], X + 1)
    wrong = torch.from_numpy(X.astype(np.float64))
    with pytest.raises(InvalidInput, match="datatype FP32; the request gave FP64"):
        await plane._step(InferenceRequest("add_one", {"INPUT0": wrong}))
    served = plane.manager.get("add_one", "")
    assert check(served, InferenceRequest("add_one", {"INPUT0": torch.from_numpy(X)}))[0] == {
        "OUTPUT0": 0
    }
    with pytest.raises(InvalidInput, match="the request gave FP64"):
        check(served, InferenceRequest("add_one", {"INPUT0": wrong}))
