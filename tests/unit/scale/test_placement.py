"""What a replica asks Ray for, from its model's instances."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, parse_config
from dlscale.scale.placement import Placement, fit_cpus, placement_of


def _config(instances: str, threads: int = 0) -> ModelConfig:
    text: dict[str, Any] = {"name": "m", "max_batch_size": 8, "instances": json.loads(instances)}
    if threads:
        text["backend_options"] = {"intra_op_threads": threads}
    return parse_config(text, "config.toml")


def test_one_cpu_per_cpu_instance_times_its_threads() -> None:
    assert placement_of(_config('[{"count": 2, "device": "cpu"}]')) == Placement(2.0)
    assert placement_of(_config('[{"count": 2, "device": "cpu"}]', threads=3)).num_cpus == 6.0


def test_gpus_are_counted_once_each() -> None:
    two = _config('[{"count": 2, "device": "cuda:1"}, {"device": "cuda:3"}]')
    assert placement_of(two) == Placement(0.0, 2.0)
    one = _config('[{"count": 2, "device": "cuda"}]')
    assert placement_of(one).actor_options() == {"num_cpus": 0.0, "num_gpus": 1.0}


def test_a_mig_instance_is_a_custom_resource_made_the_only_visible_device() -> None:
    mig = "MIG-4f8e2c1a-0b1d-5e6f-8a9b-0c1d2e3f4a5b"
    placed = placement_of(_config(f'[{{"count": 2, "device": "{mig}"}}]'))
    assert placed.actor_options() == {
        "num_cpus": 0.0,
        "num_gpus": 0.0,
        "resources": {mig: 1.0},
        "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": mig}},
    }


def test_one_process_cannot_hold_two_mig_instances_or_a_mig_and_a_gpu() -> None:
    with pytest.raises(ConfigError, match="one MIG instance"):
        placement_of(_config('[{"device": "MIG-a"}, {"device": "MIG-b"}]'))
    with pytest.raises(ConfigError, match="one MIG instance"):
        placement_of(_config('[{"device": "MIG-a"}, {"device": "cuda:0"}]'))


def test_asks_that_fit_the_cluster_are_kept() -> None:
    assert fit_cpus({"a": 1.0, "b": 1.0}, 1, 4.0, fixed=False)[0] == 1.0


def test_asks_beyond_the_cluster_shrink_to_fit_and_say_the_arithmetic() -> None:
    # The README's five models on a two-CPU host: three of them waited for ever.
    asks = {name: 1.0 for name in "abcde"}
    share, arithmetic = fit_cpus(asks, 1, 2.0, fixed=False)
    assert share == pytest.approx(0.4) and share * sum(asks.values()) <= 2.0
    assert (
        arithmetic
        == "1 replica(s) x (a 1 + b 1 + c 1 + d 1 + e 1) = 5 CPUs asked, 2 in the cluster"
    )


def test_fixed_asks_that_do_not_fit_are_refused_at_once_with_the_flag_that_fixes_them() -> None:
    with pytest.raises(ConfigError) as caught:
        fit_cpus({"a": 1.0, "b": 1.0}, 2, 2.0, fixed=True)
    message = str(caught.value)
    assert "4 CPUs asked, 2 in the cluster" in message
    assert "--cpus-per-replica (at most 0.5 fits)" in message
