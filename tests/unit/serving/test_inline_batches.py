"""Batches measured cheap run on the event loop; a batch that would hold the loop never does.

`InlineRows`' rule (serving/instance.py) through a real Instance and Batcher: a null model (it
sleeps its `delay_us` per batch, releasing the GIL as a runtime does) first computes in its
instance's thread; once enough of its batches were measured cheap there, batches of as many
rows run on the loop; larger ones still go to the thread; a model that turns slow goes back to
the thread after two batches over the bound on the loop, and a model slow from the start never
leaves it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dlscale.backends.base import BackendOptions
from dlscale.backends.null import NullBackend
from dlscale.serving.batcher import Batcher
from dlscale.serving.instance import (
    BOUND_S,
    FIRST_FAST,
    LONG_TURN,
    LOOP_MEAN_S,
    LOOP_MOST_S,
    MOST_FAST,
    THREAD_WALL_S,
    InlineRows,
    Instance,
)
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.types import Datatype, TensorSpec

SPEC = TensorSpec("x", Datatype.FP32, (-1, 4))


class WhereNull(NullBackend):
    """The real null backend, noting the thread each batch ran in."""

    threads: list[str]

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        return super().infer(inputs)


def _null(tmp_path: Path, delay_us: float) -> WhereNull:
    options = BackendOptions(
        max_batch_size=16, inputs=(SPEC,), outputs=(SPEC,), extra={"delay_us": delay_us}
    )
    backend = WhereNull(tmp_path / "model.null", options)
    backend.threads = []
    return backend


def _rows(n: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros((n, 4), np.float32)}


async def _compute(instance: Instance, inputs: dict[str, np.ndarray]) -> None:
    """One batch through `Instance.start`, as the batcher sends it; its outcome awaited."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def then(outputs: object, error: BaseException | None) -> None:
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    instance.start(inputs, then)
    await done


async def test_cheap_batches_move_to_the_loop_and_back_when_they_turn_slow(
    tmp_path: Path,
) -> None:
    backend = _null(tmp_path, 0)
    instance = Instance(backend, "null-instance")
    await instance.load()
    main = threading.current_thread().name
    try:
        await _until_inline(instance, 2)
        assert all(t.startswith("null-instance") for t in backend.threads)
        await _compute(instance, _rows(2))
        assert backend.threads[-1] == main
        await _compute(instance, _rows(3))  # more rows than measured: the thread
        assert backend.threads[-1].startswith("null-instance")
        backend.delay_us = LOOP_MOST_S * 1e6 * 3  # the model turns slow
        await _compute(instance, _rows(1))
        await _compute(instance, _rows(1))  # a second batch over the bound on the loop
        assert backend.threads[-2:] == [main, main]
        assert instance.inline.rows == 0
        backend.delay_us = 0
        await _compute(instance, _rows(1))
        assert backend.threads[-1].startswith("null-instance")  # learnt again, in the thread
    finally:
        await instance.close()


async def _until_inline(instance: Instance, rows: int) -> None:
    """Batches of `rows` until the instance runs them on the loop (bounded: a busy host may
    preempt a thread mid-batch, and such a batch teaches nothing)."""
    for _ in range(20 * FIRST_FAST):
        if instance.inline.rows >= rows:
            return
        await _compute(instance, _rows(rows))
    raise AssertionError(f"no batch of {rows} rows was measured cheap enough")


class GatedNull(WhereNull):
    """A null model whose batch, once started, waits until the test opens its gate (5 s at
    most), then sleeps its delay."""

    started: threading.Event
    gate: threading.Event

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.started.set()
        self.gate.wait(timeout=5.0)
        return super().infer(inputs)


async def test_a_model_slower_than_the_bound_never_holds_the_loop(tmp_path: Path) -> None:
    options = BackendOptions(max_batch_size=16, inputs=(SPEC,), outputs=(SPEC,))
    slow = GatedNull(tmp_path / "model.null", options)
    slow.threads, slow.started, slow.gate = [], threading.Event(), threading.Event()
    fast = _null(tmp_path, 0)
    slow_instance, fast_instance = Instance(slow, "slow-instance"), Instance(fast, "fast-instance")
    await asyncio.gather(slow_instance.load(), fast_instance.load())
    assert slow_instance.inline.measured  # it may learn the loop, were it cheap
    slow.delay_us = 20_000  # it waits: no CPU, 20 ms, over the ceiling on the wait
    assert THREAD_WALL_S < 0.02
    slow_batcher = Batcher(BatchPolicy(16), [slow_instance], ModelStats("slow", "1"))
    fast_batcher = Batcher(BatchPolicy(16), [fast_instance], ModelStats("fast", "1"))
    slow_batcher.start()
    fast_batcher.start()
    try:
        for _ in range(FIRST_FAST + 4):  # enough batches to be learnt, were they cheap
            slow.started.clear()
            slow.gate.clear()
            pending = asyncio.ensure_future(slow_batcher.infer(_rows(1)))
            await asyncio.to_thread(slow.started.wait, 5.0)
            # Its batch waits for the gate: the other model is answered meanwhile. On the
            # loop, it would hold the loop until the gate's timeout, and answer first.
            await fast_batcher.infer(_rows(1))
            assert not pending.done()
            slow.gate.set()
            await pending
        for _ in range(20 * FIRST_FAST):
            await fast_batcher.infer(_rows(1))
    finally:
        slow.gate.set()
        await asyncio.gather(slow_batcher.close(), fast_batcher.close())
        await asyncio.gather(slow_instance.close(), fast_instance.close())
    assert all(t.startswith("slow-instance") for t in slow.threads)
    assert slow_instance.inline.rows == 0
    main = threading.current_thread().name
    assert fast.threads[-1] == main and fast_instance.inline.rows == 1


def test_one_slow_batch_on_the_loop_alone_keeps_it_and_repeated_turns_back_off() -> None:
    rows = InlineRows(measured=True)
    cheap = BOUND_S / 10
    for _ in range(FIRST_FAST):
        rows.observe_thread(4, cheap, cheap)
    assert rows.allows(4) and not rows.allows(5)
    rows.observe_loop(LOOP_MOST_S * 5)  # the host preempted the loop once
    rows.observe_loop(cheap)
    assert rows.allows(4)
    wanted = FIRST_FAST
    for _ in range(3):
        rows.observe_loop(LOOP_MOST_S * 5)
        rows.observe_loop(LOOP_MOST_S * 5)
        assert not rows.allows(1)
        wanted *= 2
        for _ in range(wanted - 1):
            rows.observe_thread(4, cheap, cheap)
        assert not rows.allows(1)
        rows.observe_thread(4, cheap, cheap)
        assert rows.allows(4)
    assert wanted <= MOST_FAST


def test_a_turn_back_after_a_long_turn_is_learnt_again_from_the_first_count() -> None:
    rows = InlineRows(measured=True)
    cheap = BOUND_S / 10
    for wanted in (FIRST_FAST, 2 * FIRST_FAST, FIRST_FAST):
        for _ in range(wanted):
            assert not rows.allows(4)
            rows.observe_thread(4, cheap, cheap)
        assert rows.allows(4)
        # A short turn on the loop (the model's doing) doubles the count; a long one (the
        # host's, two preemptions in a row) does not.
        for _ in range(LONG_TURN if wanted == 2 * FIRST_FAST else 1):
            rows.observe_loop(cheap)
        rows.observe_loop(LOOP_MOST_S * 5)
        rows.observe_loop(LOOP_MOST_S * 5)


def test_a_model_that_grows_dearer_on_the_loop_goes_back_by_its_mean() -> None:
    rows = InlineRows(measured=True)
    for _ in range(FIRST_FAST):
        rows.observe_thread(4, BOUND_S / 10, BOUND_S / 10)
    dearer = (LOOP_MEAN_S + LOOP_MOST_S) / 2  # over the mean's bound, under one batch's
    turns = 0
    while rows.allows(4) and turns < 100:
        rows.observe_loop(dearer)
        turns += 1
    assert not rows.allows(1) and turns > 1  # not at its first batch: its mean did it


def test_the_thread_teaches_by_its_cpu_within_a_ceiling_on_the_wait() -> None:
    waited_for_the_gil = InlineRows(measured=True)
    computes = InlineRows(measured=True)
    sleeps = InlineRows(measured=True)
    for _ in range(4 * FIRST_FAST):
        waited_for_the_gil.observe_thread(4, THREAD_WALL_S / 2, BOUND_S / 10)
        computes.observe_thread(4, BOUND_S * 2, BOUND_S * 2)
        sleeps.observe_thread(4, THREAD_WALL_S * 2, 0.0)
    assert waited_for_the_gil.allows(4)
    assert not computes.allows(1) and not sleeps.allows(1)


def test_a_backend_that_does_not_ask_keeps_its_declared_rows() -> None:
    declared = InlineRows(declared=8)
    for _ in range(4 * FIRST_FAST):
        declared.observe_thread(64, BOUND_S / 10, BOUND_S / 10)
        declared.observe_loop(LOOP_MOST_S * 5)
    assert declared.allows(8) and not declared.allows(9)
    assert not InlineRows().allows(1)
