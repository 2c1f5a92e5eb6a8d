"""The gpu tests' own hook: a failure's traceback is printed when it happens.

`make gpu-check` stops pytest at its stage's budget, before the summary that would hold the
tracebacks; the first lent GPU showed a failure with nothing to say why (docs/testing.md).
"""

from __future__ import annotations

import sys

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        sys.stderr.write(f"\n--- {report.nodeid} failed in {report.when}:\n")
        sys.stderr.write(f"{report.longreprtext}\n---\n")
        sys.stderr.flush()
