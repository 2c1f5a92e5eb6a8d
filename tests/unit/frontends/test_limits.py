"""The limits: validated once, each a `dlscale serve` flag, each in docs/limits.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from dlscale.cli import parse
from dlscale.errors import ConfigError, PermissionDenied
from dlscale.frontends.access import Access, Restriction, grpc_group
from dlscale.frontends.limits import DescriptorBudget, Limits
from dlscale.frontends.rest.api import RestApi
from dlscale.server import settings_from
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager

DOC = Path(__file__).resolve().parents[3] / "docs" / "limits.md"
#: Set in MiB by their own flags.
IN_MIB = {"max_body_bytes": "--max-body-mb", "max_grpc_message_bytes": "--max-grpc-mb"}


def test_every_limit_is_documented_with_its_flag_and_default() -> None:
    rows = {
        line.split("|")[1].strip(): line for line in DOC.read_text().splitlines() if "| `--" in line
    }
    for item in dataclasses.fields(Limits):
        flag = IN_MIB.get(item.name, "--" + item.name.replace("_", "-"))
        assert f"`{flag}`" in rows, flag
        default = item.default // 2**20 if item.name in IN_MIB else item.default
        assert f"| {default:,} |" in rows[f"`{flag}`"], (flag, default)


@pytest.mark.parametrize("item", dataclasses.fields(Limits), ids=lambda f: f.name)
def test_every_limit_is_set_by_its_flag(item: dataclasses.Field[int | float]) -> None:
    # The flags come from the one generator of every setting group's flags: a new limit gets its
    # flag from its field, and the sizes in MiB are read back in bytes.
    flag = IN_MIB.get(item.name, "--" + item.name.replace("_", "-"))
    given = 3 if item.name in IN_MIB else item.default + 1
    limits = settings_from(parse(["serve", "repo", flag, str(given)])).limits
    assert getattr(limits, item.name) == (given * 2**20 if item.name in IN_MIB else given)
    assert limits == Limits(**{item.name: getattr(limits, item.name)})  # the others unchanged


def test_serve_flags_become_the_settings() -> None:
    args = parse(
        [
            "serve", "repo", "--max-url-bytes", "1024", "--head-timeout-s", "2.5",
            "--max-body-mb", "1", "--strict-readiness=false", "--exit-on-error",
            "--grace-s", "3", "--http-restricted-api", "model-repository:k=v",
            "--grpc-restricted-protocol", "statistics,trace:k2=v2",
        ]
    )  # fmt: skip
    settings = settings_from(args)
    assert settings.limits == Limits(max_url_bytes=1024, head_timeout_s=2.5, max_body_bytes=2**20)
    lifecycle, security, network = settings.lifecycle, settings.security, settings.network
    assert not lifecycle.strict_readiness and lifecycle.exit_on_error and lifecycle.grace_s == 3
    assert security.http_restricted == (Restriction(frozenset({"model-repository"}), "k", "v"),)
    assert security.grpc_restricted[0].groups == {"statistics", "trace"}
    assert security.tls is None and network.host == "127.0.0.1"
    assert network.http_workers == 0  # REST on the model process unless asked
    workers = settings_from(parse(["serve", "repo", "--http-workers", "3"])).network.http_workers
    assert workers == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-headers", "0"], "max_headers must be positive"),
        (["--tls-cert", "c.pem"], "go together"),
        (["--http-workers", "-1"], "0 or more"),
        (["--http-restricted-api", "nope:k=v"], "unknown"),
        (["--http-restricted-api", "health:a=b", "--http-restricted-api", "health:c=d"], "several"),
    ],
)
def test_bad_flags_are_config_errors(extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from(parse(["serve", "repo", *extra]))


def test_api_groups_follow_tritons_names(tmp_path: Path) -> None:
    # The REST routes of a real server's plane over an empty repository carry each path's group.
    routes = RestApi(HostPlane(ModelManager.open(tmp_path)))

    def rest_group(parts: Sequence[str]) -> str:
        return routes._route("/".join(["/v2", *parts]))[3]

    assert rest_group([]) == "metadata"
    assert rest_group(["health", "ready"]) == "health"
    assert rest_group(["models", "m", "versions", "2", "infer"]) == "inference"
    assert rest_group(["models", "m", "ready"]) == "health"
    assert rest_group(["models", "m", "config"]) == "model-config"
    assert rest_group(["models", "stats"]) == rest_group(["models", "m", "stats"]) == "statistics"
    assert rest_group(["repository", "index"]) == "model-repository"
    assert rest_group(["systemsharedmemory", "status"]) == "shared-memory"
    assert rest_group(["nothing"]) == ""
    service = "/inference.GRPCInferenceService/"
    assert grpc_group(service + "ModelStreamInfer") == "inference"
    assert grpc_group(service + "CudaSharedMemoryRegister") == "shared-memory"
    assert grpc_group(service + "RepositoryModelLoad") == "model-repository"
    assert grpc_group("/grpc.health.v1.Health/Check") == "health"


def test_access_checks_the_header_of_a_restricted_group_only() -> None:
    access = Access([Restriction.parse("statistics:admin-key=s3cret")])
    access.check("inference", {})
    access.check("statistics", {"admin-key": "s3cret"})
    with pytest.raises(PermissionDenied, match="'admin-key'") as caught:
        access.check("statistics", {"admin-key": "s3cre"})
    assert caught.value.http_status == 403 and caught.value.grpc_code == "PERMISSION_DENIED"


def test_the_descriptor_budget_reaps_before_it_refuses() -> None:
    budget = DescriptorBudget(2)
    assert budget.acquire() and budget.acquire()
    assert not budget.acquire()  # full, and nothing to reap
    idle = [True]

    def reap() -> bool:
        if not idle:
            return False
        idle.pop()
        budget.release()  # as a reaper does: its connection's descriptor comes back
        return True

    budget.add_reaper(reap)
    assert budget.acquire() and budget.used == 2  # one idle holder closed for it
    assert not budget.acquire()  # no idle holder left
    budget.remove_reaper(reap)
    budget.release()
    assert budget.used == 1 and budget.acquire()
    with pytest.raises(ValueError):
        DescriptorBudget(0)


@pytest.mark.parametrize(
    ("field", "value"), [("max_connections_per_peer", -1), ("reap_idle_s", -0.5)]
)
def test_connection_limits_refuse_negative_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})
