"""The REST rendering of the DataPlane's typed answers: Triton's JSON layouts."""

from __future__ import annotations

from test_grpc_convert import CONFIG, STATS

from dlscale.frontends.rest import render
from dlscale.types import (
    Datatype,
    ModelConfigView,
    ModelMetadata,
    ServerMetadata,
    TensorSpec,
    VersionPolicy,
)


def test_config_is_tritons_json() -> None:
    doc = render.model_config(CONFIG)
    assert [_core(t) for t in doc["input"]] == [
        {"name": "x", "data_type": "TYPE_STRING", "dims": [3]}
    ]
    assert [_core(t) for t in doc["output"]] == [
        {"name": "y", "data_type": "TYPE_BF16", "dims": [3, 4]}
    ]
    assert doc["output"][0]["label_filename"] == ""  # every field, as Triton prints it
    assert doc["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert doc["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 10
    group = doc["instance_group"][0]
    assert {k: group[k] for k in ("name", "kind", "count", "gpus")} == {
        "name": "m_0",
        "kind": "KIND_GPU",
        "count": 2,
        "gpus": [1],
    }
    assert doc["parameters"] == {"owner": {"string_value": "me"}, "rank": {"string_value": "3"}}
    unbatched = ModelConfigView("u", "p", "b", 0, (), (), VersionPolicy(latest=1), None, (), {})
    doc = render.model_config(unbatched)
    assert "dynamic_batching" not in doc
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}


def test_metadata_and_statistics() -> None:
    assert render.server_metadata(ServerMetadata("s", "1", ("a", "b"))) == {
        "name": "s",
        "version": "1",
        "extensions": ["a", "b"],
    }
    meta = ModelMetadata("m", ("1",), "p", (TensorSpec("x", Datatype.FP32, (-1, 2)),), ())
    assert render.model_metadata(meta)["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 2]}
    ]
    stats = render.statistics([STATS])["model_stats"][0]
    assert stats["last_inference"] == 123
    assert stats["inference_stats"]["queue"] == {"count": 2, "ns": 1000}
    assert stats["batch_stats"] == [
        {
            "batch_size": 4,
            "compute_input": {"count": 2, "ns": 10},
            "compute_infer": {"count": 2, "ns": 1000},
            "compute_output": {"count": 2, "ns": 30},
        }
    ]


def _core(tensor: dict[str, object]) -> dict[str, object]:
    return {k: tensor[k] for k in ("name", "data_type", "dims")}
