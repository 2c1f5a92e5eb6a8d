"""A real Triton server (nvidia-pytriton's tritonserver 2.51) for the shm and large benchmarks.

Runs in its own virtual environment (benchmarks/harness/peers.py `ensure_pytriton`), never imports
dlscale, and serves through Triton's own REST and gRPC frontends, dynamic batcher and system
shared-memory extension:

- identity: FP32 [batch, 3, 224, 224] returned unchanged (a Python callable);
- identity16: FP32 [batch, 16] returned unchanged (the same callable);
- resnet50: the same ONNX file as dlscale's, run by ONNX Runtime in the callable.

    python benchmarks/pytriton_server.py --http-port P --grpc-port Q [--resnet model.onnx]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

IMAGE = (3, 224, 224)


@batch
def identity(input: np.ndarray) -> dict[str, np.ndarray]:  # "input" is the tensor's name
    """The input, unchanged."""
    return {"output": input}


def resnet(path: Path, threads: int) -> Any:
    """A batched callable running the ONNX file with ONNX Runtime."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    output = session.get_outputs()[0].name

    @batch
    def infer(input: np.ndarray) -> dict[str, np.ndarray]:
        return {"output": session.run([output], {name: input})[0]}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--resnet", type=Path, help="resnet50 model.onnx (left out when absent)")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--queue-delay-us", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    args = parser.parse_args()
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
    )
    model_config = ModelConfig(
        max_batch_size=args.max_batch,
        batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us),
    )
    tensors = {
        "inputs": [Tensor(name="input", dtype=np.float32, shape=IMAGE)],
    }
    # PyTriton guards the shared-memory and statistics APIs with a token by default (its
    # counterpart of --allow-client-shm): open them to the benchmark's clients, as
    # `dlscale serve --allow-client-shm` does.
    security = TritonSecurityConfig(restricted_endpoints=["model-repository", "trace", "logging"])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            model_name="identity",
            infer_func=identity,
            outputs=[Tensor(name="output", dtype=np.float32, shape=IMAGE)],
            config=model_config,
            **tensors,
        )
        triton.bind(
            model_name="identity16",
            infer_func=identity,
            inputs=[Tensor(name="input", dtype=np.float32, shape=(16,))],
            outputs=[Tensor(name="output", dtype=np.float32, shape=(16,))],
            config=model_config,
        )
        if args.resnet is not None:
            triton.bind(
                model_name="resnet50",
                infer_func=resnet(args.resnet, args.threads),
                outputs=[Tensor(name="output", dtype=np.float32, shape=(-1,))],
                config=model_config,
                **tensors,
            )
        triton.serve()


if __name__ == "__main__":
    main()
