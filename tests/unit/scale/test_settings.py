"""`dlscale serve --ray` flags: parsed by cli.py, checked once in ScaleSettings."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.cli import main, parse
from dlscale.cli_verbs import LazyHandler
from dlscale.errors import ConfigError
from dlscale.scale.settings import ScaleSettings, parse_autoscale


def test_ray_picks_the_scale_handler_and_plain_serve_keeps_the_servers() -> None:
    assert parse(["serve", "repo"]).func.handler == LazyHandler("dlscale.server", "serve")
    args = parse(["serve", "repo", "--ray", "--replicas", "3", "--gpus-per-replica", "0.5"])
    assert args.func == LazyHandler("dlscale.scale.commands", "serve_on_ray")
    assert (args.replicas, args.gpus_per_replica) == (3, 0.5)


def test_settings_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the --ray handler needs the [ray] extra (ray[serve])")
    from dlscale.scale.commands import settings_from

    argv = ["serve", str(tmp_path), "--ray", "--address", "auto", "--autoscale", "1:4"]
    settings = settings_from(parse([*argv, "--grpc-port", "-1", "--max-body-mb", "2"]))
    assert settings.address == "auto" and settings.autoscale == (1, 4)
    assert settings.scale_down_delay_s == 30.0  # objective.DOWN_DELAY_S unless asked
    asked = settings_from(parse([*argv, "--scale-down-delay", "5"]))
    assert asked.scale_down_delay_s == 5.0
    assert settings.grpc_port is None and settings.server is not None
    # Each replica's server: the same flags, on ports of its own (gRPC off as asked).
    network = settings.server.network
    assert (network.http_port, network.grpc_port, network.metrics_port) == (0, None, 0)
    assert settings.server.limits.max_body_bytes == 2 * 2**20
    assert settings.repository == tmp_path.resolve()


@pytest.mark.parametrize(
    "flags",
    [
        ["--replicas", "4"],
        ["--autoscale", "1:4", "--scale-down-delay", "5"],
        ["--address", "auto", "--detach"],
        ["--gpus-per-replica", "0.5"],
        ["--device-workers", "2", "--cpus-per-replica", "2"],
    ],
)
def test_flags_only_ray_reads_are_refused_without_ray(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ignored, `--replicas 4` served one server and said nothing; nothing starts now.
    assert main(["serve", str(tmp_path), *flags]) == 1
    said = capsys.readouterr().err
    named = [f for f in flags if f.startswith("--") and f != "--device-workers"]
    assert all(f in said for f in named) and "--ray was not given" in said, said


@pytest.mark.parametrize("text", ["4", "a:b", "1:", ":3"])
def test_autoscale_must_be_min_colon_max(text: str) -> None:
    with pytest.raises(ConfigError, match="MIN:MAX"):
        parse_autoscale(text)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model_control": "poll"}, "not supported with --ray"),
        ({"replicas": 0}, "at least 1"),
        ({"autoscale": (3, 2)}, "MIN <= MAX"),
        ({"autoscale": (0, 2)}, "1 <= MIN"),
        ({"scale_down_delay_s": -1.0}, "--scale-down-delay -1.0: expected seconds >= 0"),
        ({"scale_down_delay_s": float("nan")}, "--scale-down-delay nan"),
        ({"cpus_per_replica": -1.0}, "--cpus-per-replica -1.0: expected CPUs >= 0"),
        ({"gpus_per_replica": -0.5}, "--gpus-per-replica -0.5: expected GPUs >= 0"),
        ({"gpus_per_replica": float("nan")}, "--gpus-per-replica nan"),
    ],
)
def test_settings_that_cannot_work_are_refused(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        ScaleSettings(repository=Path("."), **changes)  # type: ignore[arg-type]


def test_client_shared_memory_is_refused_on_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the --ray handler needs the [ray] extra (ray[serve])")
    from dlscale.scale.commands import settings_from

    with pytest.raises(ConfigError, match="own host's memory"):
        settings_from(parse(["serve", str(tmp_path), "--ray", "--allow-client-shm"]))


def test_http_workers_are_refused_on_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the --ray handler needs the [ray] extra (ray[serve])")
    from dlscale.scale.commands import settings_from

    with pytest.raises(ConfigError, match="add replicas instead"):
        settings_from(parse(["serve", str(tmp_path), "--ray", "--http-workers", "2"]))


def test_autoscaling_without_the_replicas_metrics_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the --ray handler needs the [ray] extra (ray[serve])")
    from dlscale.scale.commands import settings_from

    argv = ["serve", str(tmp_path), "--ray", "--autoscale", "1:4", "--metrics-port", "-1"]
    with pytest.raises(ConfigError, match="--autoscale needs the replicas' metrics"):
        settings_from(parse(argv))
