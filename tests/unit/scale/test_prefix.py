"""Prefix routing's configuration: config.toml's [routing], the fleet's bound, HAProxy's rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.toolkit.repositories import SIMPLE_PBTXT

from dlscale.cli import parse
from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig
from dlscale.scale.haproxy import HaproxyRouter
from dlscale.scale.haproxy_config import routes_map
from dlscale.scale.prefix import SESSION_ONLY, Routing, map_commands, routes_of
from dlscale.server import settings_from


@pytest.mark.parametrize(
    ("routing", "refusal"),
    [
        ({"prefix_bytes": 100}, "prefix_bytes 100: expected a power of two from 64 to 8192"),
        ({"prefix_bytes": 16384}, "prefix_bytes 16384: expected a power of two"),
        ({"prefix_bytes": 32}, "prefix_bytes 32"),
        ({"policy": "nearest"}, "least-work.*prefix.*session"),
        ({"factor": 150}, "factor"),  # the bound is the fleet's: a flag, not a model's field
    ],
)
def test_a_routing_table_out_of_bounds_is_refused_saying_what(
    routing: dict[str, object], refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        ModelConfig.model_validate({"name": "m", "routing": routing})


def test_a_model_keeps_least_work_unless_its_config_says_otherwise() -> None:
    config = ModelConfig.model_validate({"name": "m"})
    assert config.routing.policy == "least-work" and config.routing.prefix_bytes == 1024


@pytest.mark.parametrize("factor", ["100", "1001", "0", "-5"])
def test_a_balance_factor_out_of_bounds_is_refused(tmp_path: Path, factor: str) -> None:
    args = parse(["serve", str(tmp_path), "--route-balance-factor", factor])
    with pytest.raises(ConfigError, match=f"--route-balance-factor {factor}: .* 101 to 1000"):
        settings_from(args)


def test_the_balance_factor_is_a_serve_flag(tmp_path: Path) -> None:
    args = parse(["serve", str(tmp_path), "--route-balance-factor", "125"])
    assert settings_from(args).network.route_balance_factor == 125
    assert settings_from(parse(["serve", str(tmp_path)])).network.route_balance_factor == 150


def test_the_router_routes_the_models_that_ask_for_it(tmp_path: Path) -> None:
    for name, table in [
        ("chat", '[routing]\npolicy = "prefix"\nprefix_bytes = 256\n'),
        ("sessions", '[routing]\npolicy = "session"\n'),
        ("plain", ""),
        ("broken", '[routing]\npolicy = "prefix"\nprefix_bytes = 3\n'),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text('backend = "null"\n' + table)
    (tmp_path / "simple").mkdir()  # a Triton model keeps the defaults
    (tmp_path / "simple" / "config.pbtxt").write_text(SIMPLE_PBTXT)
    assert routes_of(tmp_path) == {"chat": 256, "sessions": SESSION_ONLY}


def test_the_map_changes_by_the_fewest_commands() -> None:
    path = Path("/r.map")
    now, wanted = {"a": 64, "b": 128, "c": 0}, {"a": 64, "b": 256, "d": 1024}
    assert map_commands(path, now, wanted) == [
        "del map /r.map c",
        "set map /r.map b 256",
        "add map /r.map d 1024",
    ]
    assert map_commands(path, wanted, wanted) == []


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
def test_haproxy_starts_with_the_rules_and_takes_new_routes_at_run_time() -> None:
    """HAProxy 2.6 itself reads the rules (it refuses a converter or rule it lacks), and the
    routed models change over its runtime API, without a restart."""
    router = HaproxyRouter("127.0.0.1", 0, 0, routing=Routing(125, {"chat": 256}))
    router.start()
    try:
        path = routes_map(router.workdir)
        assert "hash-balance-factor 125" in (router.workdir / "haproxy.cfg").read_text()
        assert _entries(router.command(f"show map {path}")) == {"chat": "256"}
        router.route({"chat": 512, "sessions": SESSION_ONLY})
        assert _entries(router.command(f"show map {path}")) == {"chat": "512", "sessions": "0"}
        router.route({})
        assert _entries(router.command(f"show map {path}")) == {}
    finally:
        router.stop()


def _entries(shown: str) -> dict[str, str]:
    """`show map`'s rows (`0x... key value`) as a dict."""
    return {row.split()[1]: row.split()[2] for row in shown.splitlines() if row.strip()}


def test_both_fleets_give_their_router_the_bound_and_the_routed_models(tmp_path: Path) -> None:
    """--device-workers (local_fleet) and --ray (deploy) build the router's Routing alike."""
    pytest.importorskip("ray", reason="--ray's router needs the [ray] extra")
    from dlscale.scale.deploy import routing_of
    from dlscale.scale.settings import ScaleSettings

    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "config.toml").write_text(
        'backend = "null"\n[routing]\npolicy = "prefix"\nprefix_bytes = 512\n'
    )
    server = settings_from(parse(["serve", str(tmp_path), "--route-balance-factor", "120"]))
    assert Routing.of(server) == Routing(120, {"chat": 512})
    ray_fleet = ScaleSettings(repository=tmp_path, server=server)
    assert routing_of(ray_fleet) == Routing(120, {"chat": 512})
    assert routing_of(ScaleSettings(repository=tmp_path)) == Routing(150, {"chat": 512})
