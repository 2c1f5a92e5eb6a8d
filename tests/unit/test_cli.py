"""The command line parses only: every verb names a handler beside what it drives, loaded lazily."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.cli import build_parser
from dlscale.cli_verbs import LazyHandler
from dlscale.cli_verbs.bench import SUBVERBS
from dlscale.cli_verbs.serve import WithoutRay
from dlscale.errors import ConfigError
from dlscale.server_settings import GROUPS
from dlscale.serving.control.mode import ModelControl


def _handlers(parser: argparse.ArgumentParser, path: str) -> dict[str, object]:
    """Each runnable command path (`plan train`, ...) and its parser's `func`."""
    found: dict[str, object] = {}
    if "func" in parser._defaults:
        found[path] = parser._defaults["func"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= _handlers(child, f"{path} {name}".strip())
    return found


def _all_handlers() -> dict[str, object]:
    found = _handlers(build_parser(), "")
    for add in SUBVERBS.values():  # `bench SUBVERB` parsers are made when parsed
        holder = argparse.ArgumentParser()
        add(holder.add_subparsers())
        found |= {f"bench {path}": func for path, func in _handlers(holder, "").items()}
    return found


def test_every_verb_has_a_lazy_handler_outside_cli() -> None:
    handlers = _all_handlers()
    expected = {
        "zoo build", "zoo list", "zoo images", "models check", "models convert", "run", "serve",
        "demo", "catalog",
        "devices", "roofline",
        "plan train", "plan serve", "bench", "bench compare", "bench allreduce",
        "bench interference", "bench multimodel", "optimize",
    }  # fmt: skip
    assert set(handlers) == expected
    for path, found in handlers.items():
        # A check of the verb's flags (cli_verbs.serve.WithoutRay) may stand before it.
        handler = found.handler if isinstance(found, WithoutRay) else found
        assert isinstance(handler, LazyHandler), path
        assert not handler.module.startswith("dlscale.cli"), path
        assert callable(handler.resolve()), path


#: The modules of dlscale.cli_verbs: the verb groups' arguments, parsing only.
VERB_MODULES = ["bench", "hardware", "optimize", "plan", "serve", "zoo_models"]


def test_parsing_imports_no_handler_module() -> None:
    # `dlscale -h` must not pay for numpy, onnx or torch: handlers load when their verb runs.
    code = (
        "import sys, dlscale.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('dlscale') or m == 'numpy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    verbs = [f"dlscale.cli_verbs.{m}" for m in VERB_MODULES]
    expected = ["dlscale", "dlscale.cli", "dlscale.cli_verbs", *verbs, "dlscale.errors"]
    assert out.stdout.strip() == str(expected)


def test_bench_workers_sweep_and_ceiling_flags_parse_before_and_after_the_target() -> None:
    from dlscale.bench.commands import bench_options
    from dlscale.cli import parse

    args = parse(
        ["bench", "--workers", "2", "grpc://h:1", "--model", "m", "--concurrency", "1:64",
         "--no-client-ceiling"]
    )  # fmt: skip
    assert args.targets == ["grpc://h:1"] and args.workers == 2
    options = bench_options(args)
    assert options.workers == 2 and options.client_ceiling is False
    assert options.concurrency is None
    assert options.concurrency_sweep == (1, 2, 4, 8, 16, 32, 64)


def test_bench_defaults_keep_the_in_process_client_and_measure_the_ceiling() -> None:
    from dlscale.bench.commands import bench_options
    from dlscale.cli import parse

    options = bench_options(parse(["bench", "http://h:1", "--model", "m", "--concurrency", "8"]))
    assert options.workers == 0 and options.client_ceiling is True
    assert options.concurrency == 8 and options.concurrency_sweep == ()


def test_bench_refuses_a_malformed_concurrency_range() -> None:
    import pytest

    from dlscale.bench.commands import bench_options
    from dlscale.cli import parse
    from dlscale.errors import BenchError

    for text in ("8:2", "0:4", "a:b", "1:2:3:4"):
        with pytest.raises(BenchError, match="--concurrency"):
            bench_options(parse(["bench", "http://h:1", "--model", "m", "--concurrency", text]))


def test_shm_owner_uids_reach_the_registry(tmp_path: Path) -> None:
    from dlscale.server import settings_from

    args = build_parser().parse_args(
        [
            "serve",
            str(tmp_path),
            "--allow-client-shm",
            "--shm-owner-uid",
            "7",
            "--shm-owner-uid",
            "9",
        ]
    )
    assert settings_from(args).shared_memory.shm_owner_uids == (7, 9)
    default = build_parser().parse_args(["serve", str(tmp_path)])
    assert settings_from(default).shared_memory.shm_owner_uids == ()


def test_serve_flags_default_to_the_settings_fields() -> None:
    # The flags are generated from the fields: parsed with no flag, they are the fields' defaults.
    from dlscale.cli import parse
    from dlscale.server_settings import ServerSettings
    from dlscale.server_settings.flags import settings_from

    assert settings_from(parse(["serve", "repo"])) == ServerSettings(Path("repo"))


@pytest.mark.parametrize(
    ("triton", "setting", "value"),
    [
        (["--model-store", "repo"], "repository", Path("repo")),
        (["repo", "--model-control-mode=poll"], "model_control", ModelControl.POLL),
        (["repo", "--repository-poll-secs", "2"], "poll_interval_s", 2.0),
        (["repo", "--exit-timeout-secs=3"], "grace_s", 3.0),
        (["repo", "--exit-on-error"], "exit_on_error", True),
        (["repo", "--strict-readiness=false"], "strict_readiness", False),
        (["repo", "--log-verbose=1"], "log_level", "DEBUG"),
        (["repo", "--log-verbose", "0"], "log_level", "INFO"),
        (["repo", "--allow-grpc=false"], "grpc_port", None),
        (["repo", "--allow-metrics", "0"], "metrics_port", None),
        (["repo", "--http-port=9000", "--allow-http=true"], "http_port", 9000),
        (["repo", "--load-model=a", "--load-model=b"], "load_models", ("a", "b")),
        (["repo", "--trace-config", "rate=10"], "trace_rate", 10),
        (["repo", "--trace-config", "count=5"], "trace_count", 5),
        (["repo", "--trace-config", "level=timestamps"], "trace_level", "TIMESTAMPS"),
        (["repo", "--trace-config", "triton,file=t.json"], "trace_file", Path("t.json")),
        (
            [
                "repo",
                "--trace-config",
                "mode=opentelemetry",
                "--trace-config",
                "opentelemetry,url=http://h:4318",
            ],
            "otlp_traces_endpoint",
            "http://h:4318",
        ),
        (["repo", "--otlp-traces-endpoint", "h:4318"], "otlp_traces_endpoint", "h:4318"),
    ],
)
def test_tritons_spellings_set_the_same_settings(
    triton: list[str], setting: str, value: object
) -> None:
    from dlscale.cli import parse
    from dlscale.server_settings.flags import settings_from

    settings = settings_from(parse(["serve", *triton]))
    groups = [settings, *(getattr(settings, name) for name in GROUPS)]
    assert next(getattr(g, setting) for g in groups if hasattr(g, setting)) == value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "which model repository"),
        (["serve", "a", "--model-repository", "b"], "two repositories"),
    ],
)
def test_serve_needs_one_repository(argv: list[str], message: str) -> None:
    from dlscale.cli import parse
    from dlscale.server_settings.flags import settings_from

    with pytest.raises(ConfigError, match=message):
        settings_from(parse(argv))


def test_model_control_is_compared_through_the_enum() -> None:
    loads = [m for m in ModelControl if m.api_loads]
    assert loads == [ModelControl.EXPLICIT, ModelControl.POLL, ModelControl.ON_DEMAND]
    assert ModelControl.EXPLICIT.loads_named and ModelControl.POLL.polls
    assert ModelControl.ON_DEMAND.loads_named and ModelControl.ON_DEMAND.on_demand
    with pytest.raises(ValueError, match="expected one of none, explicit, poll, on-demand"):
        ModelControl.of("sometimes")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-config", "mode=opentelemetry"], "needs a collector"),
        (["--trace-config", "level=TENSORS"], "expected OFF or TIMESTAMPS"),
        (["--trace-config", "rate=0"], "--trace-rate must be >= 1"),
    ],
)
def test_tritons_trace_config_is_checked(argv: list[str], message: str) -> None:
    from dlscale.cli import parse
    from dlscale.server_settings.flags import settings_from

    with pytest.raises(ConfigError, match=message):
        settings_from(parse(["serve", "repo", *argv]))


@pytest.mark.parametrize("value", ["log-frequency=3", "opentelemetry,resource=a=b", "rate"])
def test_a_trace_config_dlscale_does_not_read_is_refused_by_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlscale.cli import parse

    with pytest.raises(SystemExit):
        parse(["serve", "repo", "--trace-config", value])
    assert f"{value!r} is not a setting dlscale reads" in capsys.readouterr().err
