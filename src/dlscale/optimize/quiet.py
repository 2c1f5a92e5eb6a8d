"""Third-party chatter kept in a log file: ONNX Runtime, torch.compile/dynamo and torchao print
warnings and progress at the user while `optimize` runs, on stderr at the C level and through
Python's warnings and logging. They go to the file; dlscale's own progress (stdout) stays."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

#: Loggers of the libraries optimize drives; their records go to the file only.
THIRD_PARTY = ("torch", "torchao", "onnxruntime", "onnx", "onnxscript", "py.warnings")


@contextlib.contextmanager
def third_party_output_to(path: Path) -> Iterator[Path]:
    """While inside: file descriptor 2, Python warnings and the libraries' loggers write to
    `path` (appended); everything is put back on exit, errors included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved_fd = os.dup(2)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    # The libraries' own child loggers too: torch configures torch._dynamo and its siblings
    # with handlers of their own that do not propagate to "torch".
    known = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in THIRD_PARTY]
    loggers = [logging.getLogger(name) for name in dict.fromkeys([*THIRD_PARTY, *known])]
    saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    with path.open("ab") as sink, warnings.catch_warnings():
        os.dup2(sink.fileno(), 2)
        logging.captureWarnings(True)
        for lg in loggers:
            lg.handlers, lg.propagate = [handler], False
        try:
            yield path
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            logging.captureWarnings(False)
            for lg, (handlers, propagate) in zip(loggers, saved, strict=True):
                lg.handlers, lg.propagate = handlers, propagate
            handler.close()
