"""The messages of the libraries a generative model's load wakes, sent to the model's log file.

Loading an LLM makes torch, torchao and transformers speak on the console: torchao's kernels
that this machine cannot load, torch's pytree deprecations, a weight-loading progress bar.
None is the server's news, and each load repeats them. While a load runs, their loggers, Python
warnings and transformers' progress bars go to `<log dir>/<model>.log` instead, and the server's
log says where in one line. Loads that do this are serialised: the loggers are process-wide.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("dlscale.models")

#: The libraries whose loggers a load quiets (their children follow them).
NOISY = ("torch", "torchao", "transformers", "huggingface_hub", "accelerate", "safetensors", "vllm")
#: Where the model log files go: this environment variable, else this folder (of the cwd).
LOG_DIR_VARIABLE, LOG_DIR = "DLSCALE_MODEL_LOG_DIR", Path(".dlscale/logs")
_one_at_a_time = threading.Lock()


def model_log(model: str) -> Path:
    """The file a model's third-party messages go to."""
    return Path(os.environ.get(LOG_DIR_VARIABLE) or LOG_DIR) / f"{model}.log"


@contextmanager
def third_party_to_file(model: str) -> Iterator[Path]:
    """While the block runs, the NOISY libraries' logs, Python warnings and transformers'
    progress bars go to the model's log file (yielded); the server's log names it once."""
    path = model_log(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    with _one_at_a_time, warnings.catch_warnings():
        warnings.showwarning = _to_file(handler)
        saved = [_take_over(logging.getLogger(name), handler) for name in NOISY]
        bars = _progress_bars_off()
        try:
            yield path
        finally:
            for logger, handlers, propagate in saved:
                logger.handlers, logger.propagate = handlers, propagate
            if bars is not None:
                bars()
            handler.close()
    log.info("model %s: messages of the libraries its load used are in %s", model, path)


def _take_over(
    logger: logging.Logger, handler: logging.Handler
) -> tuple[logging.Logger, list[logging.Handler], bool]:
    saved = (logger, logger.handlers[:], logger.propagate)
    logger.handlers, logger.propagate = [handler], False
    return saved


def _to_file(handler: logging.Handler) -> Any:
    def show(message: Any, category: Any, filename: str, lineno: int, *_: Any) -> None:
        text = warnings.formatwarning(message, category, filename, lineno).rstrip()
        handler.emit(
            logging.makeLogRecord({"name": "py.warnings", "msg": text, "levelname": "WARNING"})
        )

    return show


def _progress_bars_off() -> Any:
    """Turn transformers' progress bars off; what turns them back on (None: nothing to do)."""
    hf = sys.modules.get("transformers.utils.logging")
    if hf is None or not hf.is_progress_bar_enabled():
        return None
    hf.disable_progress_bar()
    return hf.enable_progress_bar
