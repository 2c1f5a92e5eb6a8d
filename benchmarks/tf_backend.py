"""The TensorFlow backend, for BENCHMARKS.md: served over REST against TensorFlow in process, and
`dlscale optimize`'s winner against TensorFlow's FP32.

    python -m benchmarks.tf_backend [--repeats 3] [--duration 10] [--skip-optimize]

The model is a SavedModel built from code (seeded Keras MLP, 2048-4096-4096-1000, FP32: ~59
MFLOP a row, so that a row's compute outweighs what serving a request costs). Served: `dlscale
serve` (max batch 32, queue delay 500 µs, one intra- and one inter-op TensorFlow thread: on 2
cores TensorFlow's pools at their default size spin against the server's own threads) under a
closed loop of 32 REST clients with binary tensors (benchmarks/harness/clients.py); then, with
the server stopped, the same SavedModel's signature called in a child process in batches of the
mean batch the server formed and of 32, with 1 and with 2 threads; the best of these is the
reference. Targets: served >= 0.8x in process; the optimize winner >= 1.5x `tf-fp32` (run on a
copy of the repository). JSON goes to bench-results/tf_backend.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness.loads import rest_load
from benchmarks.harness.models import BenchModel
from benchmarks.harness.servers import RESULTS, WORK, start_dlscale
from benchmarks.harness.statistics import machine

MODEL = BenchModel("tf-mlp", "x", "output_0", (2048,), 32, 500)
THREADS = 1
REPO = WORK / "tf-backend"
CONFIG = (
    'backend = "tensorflow"\nmax_batch_size = 32\n[batching]\nmax_queue_delay_us = 500\n'
    f"[backend_options]\nintra_op_threads = {THREADS}\ninter_op_threads = {THREADS}\n"
    '[[instances]]\ncount = {instances}\ndevice = "cpu"\n'
)

#: Builds the SavedModel (argv: folder), or times its signature in batches (argv: folder,
#: batch, seconds, threads) and prints rows per second; a child process, so that this one has no TF.
_CHILD = """
import sys, time
import dlscale.backends.tensorflow
import keras, numpy as np, tensorflow as tf
path = sys.argv[1]
if len(sys.argv) == 2:
    keras.utils.set_random_seed(0)
    x = keras.Input((2048,), name="x")
    h = keras.layers.Dense(4096, activation="relu")(x)
    h = keras.layers.Dense(4096, activation="relu")(h)
    keras.Model(x, keras.layers.Dense(1000)(h)).export(path, verbose=False)
    sys.exit()
batch, seconds, threads = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(threads)
call = tf.saved_model.load(path).signatures["serving_default"]
rows = np.random.default_rng(0).standard_normal((batch, 2048)).astype(np.float32)
for _ in range(5):
    call(x=tf.constant(rows))
runs, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    call(x=tf.constant(rows))["output_0"].numpy()
    runs += 1
print(runs * batch / (time.perf_counter() - start))
"""


def _child(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout.strip()


def build(instances: int = 1) -> Path:
    """The repository: tf-mlp/config.toml and tf-mlp/1/model.savedmodel."""
    saved = REPO / MODEL.name / "1" / "model.savedmodel"
    for old in (REPO / MODEL.name).glob("[0-9]*"):
        if old.name != "1":  # a version an earlier optimize run wrote
            shutil.rmtree(old)
    if not saved.exists():
        saved.parent.mkdir(parents=True, exist_ok=True)
        _child(str(saved))
    (REPO / MODEL.name / "config.toml").write_text(CONFIG.format(instances=instances))
    return saved


def _mean_batch(port: int) -> float:
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL.name}/stats"
    with urllib.request.urlopen(url, timeout=30) as answer:
        stats = json.loads(answer.read())["model_stats"][0]
    return float(stats["inference_count"]) / max(1, int(stats["execution_count"]))


def served_against_inprocess(saved: Path, repeats: int, duration: float) -> list[dict[str, Any]]:
    """Per repeat: REST c=32 throughput, the server's mean batch, in-process at it and at 32."""
    rows = []
    for rep in range(repeats):
        server, _, _ = start_dlscale(REPO, [MODEL.name])
        try:
            load = rest_load(server, MODEL, True, 32, duration)
            batch = _mean_batch(server.port)
        finally:
            server.stop()
        near = str(max(1, round(batch)))
        at_batch = max(float(_child(str(saved), near, str(duration), t)) for t in ("1", "2"))
        at_max = max(float(_child(str(saved), "32", str(duration), t)) for t in ("1", "2"))
        row = {
            "repeat": rep,
            "served_rps": load.throughput,
            "p99_ms": load.percentile_ms(99),
            "errors": load.errors,
            "mean_batch": batch,
            "inprocess_at_mean_batch": at_batch,
            "inprocess_at_32": at_max,
            "ratio_at_mean_batch": load.throughput / at_batch,
            "ratio_at_32": load.throughput / at_max,
        }
        print("  " + json.dumps(row), flush=True)
        rows.append(row)
    return rows


def optimized(seconds: float) -> dict[str, Any]:
    """`dlscale optimize` on a copy of the model: each variant's median Offline rows/s."""
    from dlscale.optimize import OptimizeSettings, optimize
    from dlscale.optimize.measure import MeterSettings

    settings = OptimizeSettings(
        device="cpu",
        tolerance=0.01,
        runtime_stage=False,
        meter=MeterSettings(seconds=seconds, repeats=3, singlestream=False),
        time_budget_s=1800,
    )
    with tempfile.TemporaryDirectory(prefix="tf-optimize-", dir=WORK) as scratch:
        shutil.copytree(REPO, Path(scratch) / "repo")
        say = lambda m: print("  " + m, flush=True)  # noqa: E731
        result = optimize(Path(scratch) / "repo", MODEL.name, settings, progress=say)
    speeds = {t.variant.name: t.speed.offline_sps for t in result.trials if t.speed}
    status = {t.variant.name: t.status for t in result.trials}
    base = speeds.get("tf-fp32", 0.0)
    winner = result.winner.variant.name
    return {
        "speeds": speeds,
        "status": status,
        "winner": winner,
        "written_version": result.written_version,
        "speedup": speeds.get(winner, 0.0) / base if base else None,
    }


def main() -> None:
    """Run both measurements and write bench-results/tf_backend.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--optimize-seconds", type=float, default=3.0)
    parser.add_argument("--skip-optimize", action="store_true")
    parser.add_argument("--instances", type=int, default=1, help="served instances (1 thread each)")
    args = parser.parse_args()
    saved = build(args.instances)
    rows = served_against_inprocess(saved, args.repeats, args.duration)
    ratios = [r["ratio_at_mean_batch"] for r in rows]
    report: dict[str, Any] = {"machine": machine(), "instances": args.instances, "rest": rows}
    report["rest_ratio_median"] = statistics.median(ratios)
    print(f"served / in process (at the mean batch): median {statistics.median(ratios):.2f}")
    if not args.skip_optimize:
        report["optimize"] = optimized(args.optimize_seconds)
        print(f"optimize: {json.dumps(report['optimize'])}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "tf_backend.json" if args.instances == 1 else f"tf_backend-{args.instances}.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
