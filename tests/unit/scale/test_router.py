"""The ingress's router: model states follow Ray Serve's; metadata from what replicas described."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray Serve ingress needs the [ray] extra (ray[serve])")

from dlscale.errors import InvalidInput, NotFound, Unavailable
from dlscale.scale.deploy import AppState
from dlscale.scale.replica import ModelView, VersionView
from dlscale.scale.router import Router
from dlscale.scale.settings import ScaleSettings
from dlscale.types import (
    Datatype,
    InferenceRequest,
    ModelConfigView,
    ModelMetadata,
    TensorSpec,
    VersionPolicy,
)

SPEC = TensorSpec("x", Datatype.FP32, (-1, 4))


def _view(name: str, versions: tuple[int, ...] = (1,), single: bool = True) -> ModelView:
    def version(v: int) -> VersionView:
        meta = ModelMetadata(name, tuple(map(str, versions)), "dlscale_null", (SPEC,), (SPEC,))
        config = ModelConfigView(name, "dlscale_null", "null", 8, (SPEC,), (SPEC,),
                                 VersionPolicy(), None, ())  # fmt: skip
        if single:
            return VersionView(meta, config, (SPEC, True))
        return VersionView(meta, config, None, "needs a model with one input")

    return ModelView(name, {v: version(v) for v in versions}, "SERVE_REPLICA::x")


@pytest.fixture
def router(tmp_path: Path) -> Router:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    return Router(ScaleSettings(repository=tmp_path), failed={"c": "config.toml: bad"})


def test_a_running_model_is_described_then_ready(router: Router) -> None:
    assert router.apply({"a": AppState("DEPLOYING")}) == []
    assert not router.ready()
    assert router.apply({"a": AppState("RUNNING")}) == ["a"]
    router._routes["a"].describe(_view("a", (1, 2)))
    assert router.ready() and router.model_ready("a") and router.model_ready("a", "1")
    assert router.model_metadata("a").versions == ("1", "2")
    assert router.single_input("a") == (SPEC, True)


def test_a_model_keeps_serving_while_ray_replaces_replicas_then_is_described_again(
    router: Router,
) -> None:
    router.apply({"a": AppState("RUNNING")})
    router._routes["a"].describe(_view("a"))
    for status in ("UNHEALTHY", "DEPLOYING"):
        assert router.apply({"a": AppState(status)}) == []
        assert router.model_ready("a")
    assert router.apply({"a": AppState("RUNNING")}) == ["a"]


def test_gone_or_failed_applications_make_the_model_unavailable_with_the_reason(
    router: Router,
) -> None:
    router.apply({"a": AppState("RUNNING"), "b": AppState("RUNNING")})
    router._routes["a"].describe(_view("a"))
    message = "Traceback (most recent call last):\n  ...\nConfigError: failed its warm-up"
    router.apply({"b": AppState("DEPLOY_FAILED", message)})
    with pytest.raises(Unavailable, match="not deployed"):
        router.model_metadata("a")
    with pytest.raises(Unavailable, match="ConfigError: failed its warm-up"):
        router.model_metadata("b")
    index = {(e.name, e.state, e.reason) for e in router.repository_index()}
    assert ("c", "UNAVAILABLE", "config.toml: bad") in index


def test_lookups_fail_as_on_one_host(router: Router) -> None:
    router.apply({"a": AppState("RUNNING")})
    router._routes["a"].describe(_view("a", single=False))
    with pytest.raises(NotFound, match="unknown model 'zzz'"):
        router.model_config("zzz")
    with pytest.raises(NotFound, match=r"unknown model 'aa' \(did you mean 'a'\? loaded: 'a'\)"):
        router.model_config("aa")
    with pytest.raises(NotFound, match="no version '7'"):
        router.model_config("a", "7")
    with pytest.raises(InvalidInput, match="one input"):
        router.single_input("a")


def test_the_index_has_one_row_per_served_version(router: Router) -> None:
    router.apply({"a": AppState("RUNNING")})
    router._routes["a"].describe(_view("a", (1, 3)))
    rows = [(e.name, e.state, e.version) for e in router.repository_index(ready_only=True)]
    assert rows == [("a", "READY", "1"), ("a", "READY", "3")]
    assert [s.version for s in router.statistics()] == ["1", "3"]


def test_models_deployed_after_the_ingress_are_loading_until_their_applications_run(
    tmp_path: Path,
) -> None:
    # The ingress goes first, so that the server is live while the models deploy.
    router = Router(ScaleSettings(repository=tmp_path), pending=("a",))
    assert router.live() and not router.ready()
    assert "deploying models a" in router.not_ready_reason()
    assert router.apply({}) == []  # no application yet: still loading, not "not deployed"
    assert not router.ready()
    assert router.apply({"a": AppState("RUNNING")}) == ["a"]
    router._routes["a"].describe(_view("a"))
    assert router.ready()
    router.apply({})  # its application is gone now: forgotten, as any model's
    assert router._routes["a"].state.value == "UNAVAILABLE"


async def test_a_stream_to_an_unknown_model_or_while_stopping_is_refused_at_once(
    router: Router,
) -> None:
    with pytest.raises(NotFound, match="unknown model 'zzz'"):
        async for _ in router.stream(InferenceRequest("zzz", {})):
            pass
    router.stop_accepting()
    with pytest.raises(Unavailable, match="shutting down"):
        async for _ in router.stream(InferenceRequest("a", {})):
            pass
    assert "generate" in router.server_metadata().extensions
