"""`dlscale bench interference` on two null models: in process (QoS off and on) and against a
server with QoS and one started --no-qos. Short runs: these check the verb and its report;
tests/integration/qos/test_qos.py checks what the scheduler holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.toolkit.repositories import OBJECTIVE_US, tenants_repository
from tests.toolkit.server import serving
from tests.toolkit.slow import slow_only

from dlscale.cli import main

SHORT = ["--rate", "20", "--duration", "2s", "--repeats", "1", "--min-queries", "20"]
NAMES = ["--protected", "protected", "--neighbor", "neighbor"]


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert (out / "interference.png").stat().st_size > 0
    assert "| condition |" in (out / "report.md").read_text()
    for phase in report["phases"]:
        assert phase["p99_s"] > 0 and phase["neighbor_rate"] > 0, phase
        assert phase["errors"] == 0 and phase["neighbor_errors"] == 0
    return report


@pytest.mark.slow
@slow_only("20 s of LoadGen phases")
def test_in_process_qos_off_and_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tenants_repository(tmp_path / "repo")
    out = tmp_path / "out"
    assert main(["bench", "interference", "--repo", str(repo), *NAMES, *SHORT, "--mig",
                 "--out", str(out)]) == 0  # fmt: skip
    report = _report(out)
    assert report["conditions"] == ["off", "on"]
    assert [p["condition"] for p in report["phases"]] == ["alone", "off", "on"]
    assert report["protected"]["objective_s"] == OBJECTIVE_US / 1e6
    on = next(r for r in report["summary"]["conditions"] if r["condition"] == "on")
    assert on["p99_ratio"] > 0 and on["neighbor_kept"] > 0 and "meets_targets" in on
    # No MIG here: the MIG phases are said to wait for a device, not silently skipped.
    assert any("MIG" in note for note in report["notes"])
    assert (tmp_path / "repo" / "protected" / "config.toml").read_text().count("[qos]") == 1
    # It was silent for 379 s once: each condition and repetition is said as it begins.
    err = capsys.readouterr().err
    assert "condition off: loading" in err and "condition on: loading" in err
    assert "repetition 1/1:" in err and "repetition 1 done" in err


@pytest.mark.slow
@slow_only("20 s of LoadGen phases")
def test_against_servers_with_and_without_qos(tmp_path: Path) -> None:
    repo = tenants_repository(tmp_path / "repo")
    out = tmp_path / "out"
    with serving(repo) as with_qos, serving(repo, qos=False) as without:
        urls = [f"http://{with_qos.http_url}", f"http://{without.http_url}"]
        args = ["bench", "interference", *urls, *NAMES, *SHORT, "--objective", "80ms"]
        assert main([*args, "--out", str(out)]) == 0
    report = _report(out)
    assert report["conditions"] == ["off", "on"]  # the --no-qos server measures alone
    assert {p["condition"] for p in report["phases"]} == {"alone", "off", "on"}
    alone = next(r for r in report["summary"]["conditions"] if r["condition"] == "alone")
    assert alone["protected_share"] is not None  # from the statistics extension
