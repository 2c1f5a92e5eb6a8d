"""optimize keeps third-party chatter (C-level stderr, warnings, the libraries' loggers) in its
log file, and puts everything back afterwards."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

from dlscale.optimize.quiet import third_party_output_to


def test_chatter_goes_to_the_file_and_not_at_the_user(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "optimize.log"
    torch_propagates = logging.getLogger("torch").propagate  # whatever an import made it
    # As torch configures it once imported: a handler of its own on stderr, not propagating.
    dynamo = logging.getLogger("torch._dynamo")
    saved = (dynamo.handlers[:], dynamo.propagate)
    dynamo.handlers, dynamo.propagate = [logging.StreamHandler(sys.stderr)], False
    try:
        _chatter(log)
        assert dynamo.propagate is False and len(dynamo.handlers) == 1  # put back as it was
    finally:
        dynamo.handlers, dynamo.propagate = saved
    out, err = capfd.readouterr()
    text = log.read_text()
    assert "onnxruntime-style C++ warning" in text and "dynamo recompiles" in text
    assert "graph break" in text
    assert err == "" and out == "dlscale's own progress\n"
    # Afterwards stderr is the terminal's again, and the loggers are as they were.
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert logging.getLogger("torch").propagate is torch_propagates


def _chatter(log: Path) -> None:
    with third_party_output_to(log):
        os.write(2, b"onnxruntime-style C++ warning\n")
        warnings.warn("dynamo recompiles", UserWarning, stacklevel=1)
        logging.getLogger("torch._dynamo").warning("graph break")
        print("dlscale's own progress", flush=True)


def test_an_error_inside_restores_stderr(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), third_party_output_to(tmp_path / "x.log"):
        raise RuntimeError("boom")
    os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"
