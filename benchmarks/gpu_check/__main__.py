"""`python -m benchmarks.gpu_check`: the entry point (runner.main)."""

from __future__ import annotations

import sys

from benchmarks.gpu_check.runner import main

if __name__ == "__main__":
    sys.exit(main())
