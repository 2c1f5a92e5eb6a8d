"""The JPEG -> top-5 pipeline on a real Triton (nvidia-pytriton), written the natural way.

Run by servers.start_pytriton_e2e with PyTriton's own virtual environment (peers.ensure_pytriton)
and the checkout's root and src on PYTHONPATH: one Python callable bound as model
"smallcnn-e2e" with Triton's dynamic batcher; for each batch it decodes every JPEG, stacks the
pixels, runs the ONNX model and writes the top 5 (e2e_apps.Classifier: the same decode and the
same model file as dlscale's pipeline). Served over Triton's own REST and gRPC frontends.

    python benchmarks/harness/pytriton_e2e.py --repo REPO --http-port P --grpc-port Q \
        --metrics-port M
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from benchmarks.harness.e2e_apps import (
    MAX_BATCH,
    PIPELINE,
    QUEUE_DELAY_US,
    TOP_K,
    Classifier,
    E2ESpec,
    element,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    classifier = Classifier(E2ESpec.read(args.repo))

    @batch
    def infer(image: np.ndarray) -> dict[str, np.ndarray]:  # "image": the input's name
        return {"labels": classifier.run([element(row[0]) for row in image])}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=PIPELINE,
            infer_func=infer,
            inputs=[Tensor(name="image", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name="labels", dtype=np.bytes_, shape=(TOP_K,))],
            config=ModelConfig(
                max_batch_size=MAX_BATCH,
                batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US),
            ),
        )
        triton.serve()


if __name__ == "__main__":
    main()
