"""The Ray Serve deployment of the replicas: when a redeploy keeps them, when it replaces them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlscale.cli import parse
from dlscale.server import settings_from

pytest.importorskip("ray", reason="--ray's replicas need the [ray] extra")

from dlscale.scale.deploy import replica_version
from dlscale.scale.placement import Placement
from dlscale.scale.settings import ScaleSettings


def test_a_switch_between_autoscaled_and_fixed_replaces_the_replicas(tmp_path: Path) -> None:
    """A new count or new autoscaling bounds keep the running replicas (the same version);
    autoscaled <-> fixed does not: a replica Ray keeps through that switch logs a failed push
    of its figures every second."""
    server = settings_from(parse(["serve", str(tmp_path)]))
    placement = Placement(num_cpus=0.5)

    def version(**asked: Any) -> str:
        fleet = ScaleSettings(repository=tmp_path, server=server, **asked)
        return replica_version(fleet, placement)

    assert version(replicas=1) == version(replicas=3)
    assert version(autoscale=(1, 2)) == version(autoscale=(2, 8))
    assert version(replicas=1) != version(autoscale=(1, 2))
