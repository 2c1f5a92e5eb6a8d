"""`dlscale catalog` and `devices` as a user runs them (in-process)."""

from __future__ import annotations

import json

import pytest

from dlscale.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_devices_json_on_this_machine_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "devices", "--json")
    assert code == 0 and err == ""
    host = json.loads(out)
    assert host["cpu"]["physical_cores"] >= 1
    if host["nvml"] != "ok":  # no GPU here: an empty list and the reason, no traceback
        assert host["gpus"] == [] and host["nvml"].startswith("unavailable")
    code, out, err = _run(capsys, "devices")
    assert code == 0 and out.startswith("CPU: ") and "Traceback" not in out + err


def test_catalog_lists_and_shows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "catalog")
    assert code == 0
    assert "H100-SXM" in out and "GB200-NVL72" in out and "TPU-v5e" in out
    code, out, _ = _run(capsys, "catalog", "h100")
    assert code == 0 and out.startswith("H100-SXM") and "datasheet" in out and "1g.10gb" in out
    code, out, _ = _run(capsys, "catalog", "H100-SXM", "--json")
    entry = json.loads(out)
    assert entry["dense_flops"]["int8"] == 1979e12
    assert entry["sources"]["int8"]
    code, out, _ = _run(capsys, "catalog", "--json")
    assert len(json.loads(out)) >= 30


def test_catalog_unknown_name_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "catalog", "H100-SXM6")
    assert code == 1 and "no device 'H100-SXM6'" in err and "H100-SXM" in err
