"""What a worker process costs a Python model: one batch in process against in a worker.

    python -m benchmarks.python_isolation [--repeats 3] [--calls 1000]

Triton's add_sub model.py (two FP32 inputs, their sum and difference) on the python backend,
called directly (`PythonBackend.infer`, no server, one request per batch) with
`isolation = "thread"` and `"process"`, alternating within each repetition, at 16 bytes and
1 MiB per tensor. Prints the median latency of a call for each, over the repetitions' medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dlscale.backends import BackendOptions
from dlscale.backends.python import PythonBackend
from dlscale.types import Datatype, TensorSpec

ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def median_call_us(folder: Path, width: int, isolation: str, calls: int) -> float:
    """The median latency of `calls` batches of one row of `width` floats per tensor."""
    specs = [
        TensorSpec(f"{k}{i}", Datatype.FP32, (-1, width))
        for k in ("INPUT", "OUTPUT")
        for i in (0, 1)
    ]
    options = BackendOptions(
        max_batch_size=1,
        extra={"isolation": isolation},
        inputs=tuple(specs[:2]),
        outputs=tuple(specs[2:]),
    )
    backend = PythonBackend(folder / "1" / "model.py", options)
    backend.load()
    x = np.ones((1, width), np.float32)
    feed = {"INPUT0": x, "INPUT1": x}
    for _ in range(20):
        backend.infer(feed)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        backend.infer(feed)
        times.append(time.perf_counter() - start)
    backend.unload()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dlscale-pybench-")) / "add_sub"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(ADD_SUB)
    for width, label in ((4, "16 B"), (1 << 18, "1 MiB")):
        runs: dict[str, list[float]] = {"thread": [], "process": []}
        for _ in range(args.repeats):
            for isolation in runs:
                calls = args.calls if width == 4 else max(args.calls // 10, 20)
                runs[isolation].append(median_call_us(folder, width, isolation, calls))
        thread, process = (statistics.median(runs[k]) for k in ("thread", "process"))
        added = process - thread
        print(
            f"{label} per tensor: thread {thread:.1f} us, process {process:.1f} us (+{added:.1f})"
        )


if __name__ == "__main__":
    main()
