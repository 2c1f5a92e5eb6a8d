"""TensorFlow's process-wide settings: its thread pools, and where a model is placed."""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

from dlscale.errors import ConfigError
from dlscale.types import DEVICE_EXPECTED, cuda_index, is_mig

log = logging.getLogger(__name__)

_lock = threading.Lock()
#: The (intra, inter) op threads TensorFlow was given, once it was given any.
_threads: tuple[int, int] | None = None


def bound_threads(intra: int, inter: int) -> None:
    """Give TensorFlow's thread pools these sizes (0: its own choice, the core count).

    The pools belong to the process and are fixed once TensorFlow's runtime starts: the first
    TensorFlow model loaded sets them, and a later model that asks for other sizes gets a
    warning that says which sizes hold.
    """
    global _threads
    with _lock:
        if _threads is None:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(intra)
                tf.config.threading.set_inter_op_parallelism_threads(inter)
            except RuntimeError:  # TensorFlow already ran something in this process
                log.warning(
                    "TensorFlow's runtime had started before the first TensorFlow model loaded: "
                    "its thread pools keep the sizes it started with"
                )
            _threads = (
                tf.config.threading.get_intra_op_parallelism_threads(),
                tf.config.threading.get_inter_op_parallelism_threads(),
            )
        elif (intra, inter) not in ((0, 0), _threads):
            log.warning(
                "TensorFlow's thread pools are per process and were set to intra=%d inter=%d by "
                "the first TensorFlow model; this one asked for intra=%d inter=%d",
                *_threads,
                intra,
                inter,
            )


def place(device: str) -> str:
    """TensorFlow's device name for a config's device: /CPU:0, or /GPU:N where TF sees it."""
    if device == "cpu":
        return "/CPU:0"
    index = cuda_index(device)
    if index is None and not is_mig(device):
        raise ConfigError(f"device {device!r}: {DEVICE_EXPECTED}")
    gpus = tf.config.list_physical_devices("GPU")
    if (index or 0) >= len(gpus):
        raise ConfigError(
            f"device {device!r}: TensorFlow sees {len(gpus)} GPU(s) here (tensorflow-cpu sees "
            "none; a GPU needs the `tensorflow[and-cuda]` build); use device 'cpu'"
        )
    # A MIG instance is the process's only visible device (CUDA_VISIBLE_DEVICES), so /GPU:0.
    return f"/GPU:{index or 0}"
