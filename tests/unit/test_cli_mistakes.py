"""A user's mistake on the command line is a message naming it and exit code 1 (the verb refused)
or 2 (argparse refused the flag), never a traceback. Each case below was a traceback once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.cli import main

PLAN_TRAIN = ["plan", "train", "--flops-per-sample", "1e9", "--samples", "10"]
PLAN_SERVE = ["plan", "serve", "--flops-per-sample", "1e9", "--bytes-per-sample", "1e6"]
PLAN_SERVE += ["--qps", "10", "--p99", "15ms"]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's refusal of a flag's value
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["zoo", "images", "--size", "abc"], 2, "'abc': expected WIDTHxHEIGHT"),
        (["zoo", "images", "--size", "-5"], 2, "'-5': expected WIDTHxHEIGHT"),
        (["zoo", "images", "--size", "0x5"], 2, "1 to 65535 pixels each"),
        ([*PLAN_TRAIN, "--precision", "fp3"], 1, "unknown precision 'fp3'"),
        (["run", "repo", "m", "--batch", "0"], 2, "'0': expected a whole number, 1 or more"),
        (["run", "repo", "m", "--batch", "-3"], 2, "'-3': expected a whole number"),
        (["run", "repo", "m", "--seconds", "nan"], 2, "'nan': expected seconds above 0"),
        (["bench", "http://[::1", "--model", "m"], 1, "target 'http://[::1': expected"),
        (["bench", "http://127.0.0.1:99999", "--model", "m"], 1, "expected http://HOST:PORT"),
        (["bench", "grpc://127.0.0.1:port", "--model", "m"], 1, "expected http://HOST:PORT"),
        # Named by the flag the user gave, not by the option's field (--min-query-count once).
        (
            ["bench", "http://127.0.0.1:1", "--model", "m", "--min-queries", "-1"],
            1,
            "--min-queries must be at least 1, got -1",
        ),
        (
            ["bench", "http://127.0.0.1:1", "--model", "m", "--samples", "0"],
            1,
            "--samples must be at least 1, got 0",
        ),
        (
            ["bench", "http://127.0.0.1:1", "--model", "m", "--connections", "0"],
            1,
            "--connections must be at least 1, got 0",
        ),
    ],
)
def test_a_value_that_cannot_be_read_is_named(
    argv: list[str], code: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "images")] if argv[:2] == ["zoo", "images"] else []
    assert _run([*argv, *out]) == code
    said = capsys.readouterr().err
    assert message in said and "Traceback" not in said, said


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (PLAN_TRAIN, "--plot"),
        (PLAN_SERVE, "--json"),
        (["bench", "allreduce"], "--json"),
        (["bench", "allreduce"], "--plot"),
    ],
)
def test_a_file_to_write_is_checked_before_the_work(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each wrote its file after the work, and a missing folder was a FileNotFoundError then.
    missing = tmp_path / "no-such-folder" / "out.json"
    assert _run([*argv, flag, str(missing)]) == 2
    assert f"there is no folder {missing.parent}" in capsys.readouterr().err
    assert _run([*argv, flag, str(tmp_path)]) == 2
    assert "it is a folder" in capsys.readouterr().err
    assert not missing.parent.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["zoo", "build", "{}"],
        ["zoo", "images", "--out", "{}"],
        ["bench", "http://127.0.0.1:1", "--model", "m", "--out", "{}"],
    ],
)
def test_a_folder_to_write_into_under_a_file_is_refused(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    assert _run([a.format(a_file / "out") for a in argv]) == 2
    assert f"{a_file} is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "not a folder"


def test_a_file_to_read_is_checked_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --reference is read only with --accuracy or a roofline: a mistyped one went unnoticed.
    bench = ["bench", "http://127.0.0.1:1", "--model", "m", "--reference"]
    assert _run([*bench, str(tmp_path / "missing.onnx")]) == 1
    assert "missing.onnx: no such file" in capsys.readouterr().err
    assert _run([*bench, str(tmp_path)]) == 1
    assert f"--reference {tmp_path}: not a file" in capsys.readouterr().err


def test_a_plan_is_written_where_asked(tmp_path: Path) -> None:
    written = tmp_path / "plans.json"
    # One device: the whole catalog's search took 33 s (55 s beside two burners) for one file.
    assert _run([*PLAN_SERVE, "--devices", "L4", "--json", str(written)]) == 0
    assert [plan["device"] for plan in json.loads(written.read_text())] == ["L4"]
