"""ServerSettings: groups filled from flat keywords, each checked where it is defined."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.errors import ConfigError
from dlscale.frontends.limits import Limits
from dlscale.frontends.tls import TlsFiles
from dlscale.server_settings import ServerSettings
from dlscale.serving.control.mode import ModelControl


def test_flat_keywords_go_to_their_groups() -> None:
    settings = ServerSettings.build(
        Path("r"), http_port=0, model_control="explicit", grace_s=2.0, max_body_bytes=1024
    )
    assert settings.network.http_port == 0 and settings.network.grpc_port == 8001
    assert settings.models.model_control is ModelControl.EXPLICIT
    assert settings.lifecycle.grace_s == 2.0
    assert settings.limits == Limits(max_body_bytes=1024)
    changed = settings.replace(limits=Limits(keep_alive_s=3.0), max_headers=7)
    assert changed.limits == Limits(keep_alive_s=3.0, max_headers=7)
    assert changed.network == settings.network


def test_an_unknown_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="no setting 'http_prot'"):
        ServerSettings.build(Path("r"), http_prot=0)


def test_each_group_checks_its_own_fields() -> None:
    with pytest.raises(ConfigError, match="go together"):
        ServerSettings.build(Path("r"), tls_cert=Path("c.pem"))
    with pytest.raises(ValueError, match="expected one of none, explicit, poll"):
        ServerSettings.build(Path("r"), model_control="sometimes")
    files = ServerSettings.build(Path("r"), tls_cert=Path("c"), tls_key=Path("k")).security.tls
    assert files == TlsFiles(Path("c"), Path("k"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--http-port", "99999"], "--http-port 99999: expected a port from 0 to 65535"),
        (["--grpc-port", "-5"], "--grpc-port -5: expected a port"),  # -1 alone turns it off
        (["--poll-interval", "0"], "--poll-interval 0.0: seconds above 0"),
        (["--grace-s", "-1"], "--grace-s -1.0: seconds, 0 or more"),
        (["--grace-s", "nan"], "--grace-s nan"),
        (["--max-shm-regions", "0"], "--max-shm-regions 0: 1 or more"),
        (["--log-level", "LOUD"], "--log-level LOUD: expected one of DEBUG, INFO"),
        (["--log-file", "{tmp}/no-such-folder/log"], "there is no folder"),
        (["--log-file", "{tmp}"], "it is a folder"),
        (["--trace-file", "{tmp}/no-such-folder/t.json"], "there is no folder"),
    ],
)
def test_a_setting_that_cannot_work_is_refused_before_the_server_starts(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each once started a server that served with it (a negative poll interval, an unknown log
    # level, -5 as "off"), or failed with a traceback (a NaN grace at shutdown, the log file).
    argv = ["serve", str(tmp_path), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_the_settings_defaults_are_those_of_the_parts_they_set() -> None:
    # Each default is written once, where the part that uses it can read it; the settings and
    # the parts' own defaults (used by code and tests that build a part alone) agree.
    import inspect

    from dlscale.frontends.grpc.frontend import GrpcFrontend
    from dlscale.frontends.rest.transport import HttpFrontend
    from dlscale.frontends.workers.pool import HttpWorkers
    from dlscale.serving.observe.trace import TraceSettings
    from dlscale.serving.regions.registry import SharedMemoryRegistry

    settings = ServerSettings(Path("r"))
    assert settings.observation.trace_rate == TraceSettings().rate
    assert settings.shared_memory.max_shm_regions == SharedMemoryRegistry().max_regions
    for frontend in (GrpcFrontend, HttpFrontend, HttpWorkers):
        grace = inspect.signature(frontend.stop).parameters["grace_s"].default
        assert settings.lifecycle.grace_s == grace, frontend
