"""ServerSettings: groups filled from flat keywords, each checked where it is defined."""

from __future__ import annotations

from pathlib import Path

import pytest

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
