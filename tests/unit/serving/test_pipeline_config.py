"""A pipeline's config: [[steps]] in config.toml and Triton's ensemble_scheduling, and the DAG
rules checked before anything loads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tests.toolkit.pipelines import (
    CHAIN_PBTXT,
    pipeline_repository,
    pipeline_toml,
    step,
    write_pipeline,
)

from dlscale.errors import ConfigError
from dlscale.models.commands import models_check
from dlscale.models.config import load_config
from dlscale.models.repository import ModelRepository
from dlscale.models.triton_config import convert as convert_triton
from dlscale.models.triton_config import parse_pbtxt


def _load(tmp_path: Path, text: str) -> None:
    write_pipeline(tmp_path, "pipe", text)
    load_config(tmp_path / "pipe" / "config.toml", "pipe")


def test_steps_in_config_toml_make_a_pipeline(tmp_path: Path) -> None:
    steps = [
        step("first", {"INPUT0": "x"}, {"OUTPUT0": "mid"}),
        step("second", {"INPUT0": "mid"}, {"OUTPUT0": "y"}),
    ]
    write_pipeline(tmp_path, "pipe", pipeline_toml(4, ["x"], ["y"], steps))
    (version,) = ModelRepository(tmp_path).versions("pipe")
    config = version.config
    assert config.is_pipeline and config.platform_name == "ensemble"
    assert [(s.model, s.version, s.input_map) for s in config.steps or ()] == [
        ("first", 0, {"INPUT0": "x"}),
        ("second", 0, {"INPUT0": "mid"}),
    ]
    # No model file: the empty version folder is the version.
    assert version.version == 1 and version.model_file == tmp_path / "pipe" / "1"


@pytest.mark.parametrize(
    ("steps", "outputs", "error"),
    [
        (
            [step("a", {"i": "x"}, {"o": "y"}), step("b", {"i": "x"}, {"o": "y"})],
            ["y"],
            "tensor 'y' is already made by step 1",
        ),
        ([step("a", {"i": "x"}, {"o": "x"})], ["x"], "tensor 'x' is already made by a pipeline"),
        ([step("a", {"i": "nowhere"}, {"o": "y"})], ["y"], r"steps.1 \(a\): no input or step"),
        ([step("a", {"i": "x"}, {"o": "z"})], ["y"], r"no step makes the pipeline outputs \['y'\]"),
        (
            [step("a", {"i": "q"}, {"o": "p"}), step("b", {"i": "p"}, {"o": "q"})],
            ["p"],
            r"steps \[1, 2\] wait on each other in a circle",
        ),
    ],
)
def test_a_graph_that_cannot_run_is_refused_with_the_step(
    tmp_path: Path, steps: list[str], outputs: list[str], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        _load(tmp_path, pipeline_toml(0, ["x"], outputs, steps))


def test_a_pipeline_sets_no_runtime_field_of_its_own(tmp_path: Path) -> None:
    steps = [step("a", {"i": "x"}, {"o": "y"})]
    extra = "[batching]\nmax_queue_delay_us = 100\n"
    with pytest.raises(ConfigError, match=r"runs no model of its own: remove \['batching'\]"):
        _load(tmp_path, pipeline_toml(4, ["x"], ["y"], steps, extra))
    undeclared = "".join(steps)
    with pytest.raises(ConfigError, match=r"declares its \[\[inputs\]\] and \[\[outputs\]\]"):
        _load(tmp_path, undeclared)


def test_tritons_ensemble_scheduling_converts_to_steps() -> None:
    config, ignored = convert_triton(parse_pbtxt(CHAIN_PBTXT, "chain"), "chain", "chain")
    assert ignored == ()
    assert config.is_pipeline and config.max_batch_size == 8
    assert [(s.model, s.version, s.output_map) for s in config.steps or ()] == [
        ("add_one", 0, {"OUTPUT0": "plus_one"}),
        ("copy", 0, {"OUTPUT0": "RESULT"}),
    ]


def test_models_check_loads_the_steps_runtimes_and_passes_the_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline_repository(tmp_path)
    models_check(argparse.Namespace(dir=tmp_path, load=True))
    out = capsys.readouterr().out
    for name in ("add_one", "chain", "diamond"):
        assert f"ok     {name} (versions [1])" in out
