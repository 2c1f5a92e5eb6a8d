"""The child process of the TensorFlow runs (tf_mirrored.py): MirroredStrategy over virtual CPUs.

`python -m dlscale.plan.tf_mirrored_worker '<json>'` splits the CPU into `nproc` logical devices
(tf.config.set_logical_device_configuration), then either all-reduces float32 buffers of each
size inside `strategy.run` (values checked before and after the timed calls, as the gloo run
checks its own), or trains a small dense model for a few steps on 1 and on `nproc` replicas.
It prints one JSON object. TensorFlow is imported here only: a child process of its own, so
that the logical devices can be set before TensorFlow starts.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_PATTERN = 7  # element i of replica r holds (r + 1) * (i % 7 + 1), as in the gloo run


def _timed(call: Callable[[], Any], warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _strategy(tf: Any, replicas: int) -> Any:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _fabric(tf: Any, strategy: Any) -> dict[str, float]:
    """Host memory as the fabric: copy bandwidth of 32 MiB, and an empty replicated call's cost."""
    source, target = np.ones(8 << 20, np.float32), np.empty(8 << 20, np.float32)
    copy = statistics.median(_timed(lambda: np.copyto(target, source), 2, 5))

    def nothing() -> Any:
        return tf.constant(0.0)

    empty = tf.function(lambda: strategy.run(nothing))
    call = statistics.median(_timed(empty, 5, 50))
    return {"bandwidth": source.nbytes / copy, "call_s": call}


def _sum_over_replicas(x: Any) -> Any:
    import tensorflow as tf

    return tf.distribute.get_replica_context().all_reduce("sum", x)


def allreduce(tf: Any, nproc: int, sizes: list[int], iters: int, warmup: int) -> dict[str, Any]:
    """Time the replicas' all-reduce (sum) of each size; check every element twice."""
    strategy = _strategy(tf, nproc)
    rows, checked = [], 0
    for nbytes in sizes:
        n = nbytes // 4
        pattern = (np.arange(n) % _PATTERN + 1).astype(np.float32)
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, p=pattern: tf.constant(p * (ctx.replica_id_in_sync_group + 1))
        )
        reduce = tf.function(lambda v: strategy.run(_sum_over_replicas, args=(v,)))
        want = pattern * nproc * (nproc + 1) / 2

        def check(v: Any = values, want: np.ndarray = want, reduce: Any = reduce) -> int:
            for result in strategy.experimental_local_results(reduce(v)):
                if not np.array_equal(result.numpy(), want):
                    raise AssertionError("a replica's all-reduced values are wrong")
            return want.size * nproc

        checked += check()
        times = _timed(functools.partial(reduce, values), warmup, iters)
        checked += check()
        rows.append({"nbytes": 4 * n, "times": times})
    return {"rows": rows, "checked": checked, "fabric": _fabric(tf, strategy)}


def train(tf: Any, nproc: int, steps: int, batch: int, width: int) -> dict[str, Any]:
    """Median step time of a dense model on 1 replica and on `nproc`, same batch per replica."""
    result: dict[str, Any] = {}
    for replicas in (1, nproc):
        strategy = _strategy(tf, replicas)
        result[str(replicas)], result["params"] = _train_steps(tf, strategy, steps, batch, width)
        result["fabric"] = _fabric(tf, strategy)
    return result


def _train_steps(tf: Any, strategy: Any, steps: int, batch: int, width: int) -> tuple[float, int]:
    """(median step seconds, trainable parameters) of SGD on a two-layer dense model."""
    import keras

    with strategy.scope():
        keras.utils.set_random_seed(0)
        layers = [keras.layers.Dense(width, activation="relu"), keras.layers.Dense(width)]
        model = keras.Sequential([keras.Input((width,)), *layers])
        optimizer = keras.optimizers.SGD(0.01)
    x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    inputs = strategy.experimental_distribute_values_from_function(lambda _ctx: x)

    def step_fn(v: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(v, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    step = tf.function(lambda v: strategy.run(step_fn, args=(v,)))
    times = _timed(lambda: step(inputs), 3, steps)
    params = int(sum(np.prod(w.shape) for w in model.trainable_variables))
    return statistics.median(times), params


def main(argv: list[str]) -> None:
    """Run the job `argv[0]` (JSON) describes and print its result as JSON."""
    job = json.loads(argv[0])
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    config = [tf.config.LogicalDeviceConfiguration() for _ in range(job["nproc"])]
    tf.config.set_logical_device_configuration(cpu, config)
    if job["kind"] == "allreduce":
        out = allreduce(tf, job["nproc"], job["sizes"], job["iters"], job["warmup"])
    else:
        out = train(tf, job["nproc"], job["steps"], job["batch"], job.get("width", 256))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
