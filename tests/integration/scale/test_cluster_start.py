"""The Ray tests' cluster start: a failed start is tried once more from scratch, and the retry is
a warning, which a passing run lists in its summary (a line on stderr it would not show).

Ray cannot be made to miss its fixed 30 s for a raylet or a GCS server to show itself on
demand, so the starts here go to a stand-in for Ray's `Cluster` whose `add_node` fails as Ray's
did on a starved host; every other test of this folder runs on the real start.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from tests.integration.scale.conftest import CLUSTER_STARTS, _start_nodes


class _Nodes:
    """Records what a cluster start did; its first `fail_starts` clusters fail their first node."""

    made: ClassVar[list[_Nodes]] = []
    fail_starts = 0

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.shut = False
        self.fails = len(_Nodes.made) < _Nodes.fail_starts
        _Nodes.made.append(self)

    def add_node(self, **options: Any) -> None:
        if self.fails:
            raise RuntimeError("The current node timed out during startup.")
        self.nodes.append(options)

    def shutdown(self) -> None:
        self.shut = True


@pytest.fixture
def nodes() -> type[_Nodes]:
    _Nodes.made = []
    return _Nodes


def test_a_start_that_succeeds_is_not_retried(nodes: type[_Nodes]) -> None:
    nodes.fail_starts = 0
    cluster, ports = _start_nodes(nodes)
    assert nodes.made == [cluster]
    assert len(cluster.nodes) == 2  # the head and the worker
    assert [node["metrics_export_port"] for node in cluster.nodes] == list(ports)
    assert not cluster.shut


def test_a_failed_start_is_shut_down_and_tried_again_with_a_warning(nodes: type[_Nodes]) -> None:
    nodes.fail_starts = 1
    with pytest.warns(UserWarning, match="Ray cluster start 1 failed, starting again: .*timed out"):
        cluster, _ = _start_nodes(nodes)
    first, second = nodes.made
    assert first.shut and not second.shut
    assert cluster is second and len(second.nodes) == 2


def test_a_start_that_fails_every_time_fails_the_fixture(nodes: type[_Nodes]) -> None:
    nodes.fail_starts = CLUSTER_STARTS
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="timed out"):
        _start_nodes(nodes)
    assert len(nodes.made) == CLUSTER_STARTS
    assert all(made.shut for made in nodes.made)
