"""What a test may assert of a LoadGen run's verdict: the path it tests, not this CPU's speed."""

from __future__ import annotations

from typing import Any

#: What a Server run may miss on a loaded machine: its latency bound and the early-stopping
#: estimate of it are claims about this CPU's speed, not about the path under test.
SPEED_REASONS = {"Performance constraints satisfied: NO", "Early stopping satisfied: NO"}


def every_sample_answered(report: dict[str, Any]) -> None:
    """Each scenario of a `dlscale bench` report answered every sample it issued, without an
    error, with sane latencies; VALID, but for a Server run INVALID for speed alone."""
    for entry in report["scenarios"]:
        res = entry["result"]
        if entry["scenario"] == "Server" and res["verdict"] != "VALID":
            assert set(res["reasons"]) <= SPEED_REASONS, res["reasons"]
        else:
            assert res["verdict"] == "VALID", res["reasons"]
        # LoadGen's own count of answered samples agrees with the bench's.
        assert res["completed"] == res["issued"] > 0 and res["errors"]["count"] == 0
        assert 0 < res["latency_s"]["p50"] <= res["latency_s"]["p99"]
