"""The config view's instance groups: where each group of instances runs, in Triton's terms."""

from __future__ import annotations

import pytest

from dlscale.models.config import InstanceConfig
from dlscale.serving.control.views import _instance_group
from dlscale.types import InstanceKind, cuda_index, is_mig


@pytest.mark.parametrize(
    ("device", "kind", "gpus"),
    [
        ("cpu", InstanceKind.CPU, ()),
        # Triton reads a GPU group that lists no GPUs as every GPU: cuda is cuda:0 alone.
        ("cuda", InstanceKind.GPU, (0,)),
        ("cuda:3", InstanceKind.GPU, (3,)),
        ("MIG-4f1c2d3e-aaaa-bbbb-cccc-0123456789ab", InstanceKind.GPU, ()),
    ],
)
def test_a_group_names_its_kind_and_gpus(device: str, kind: InstanceKind, gpus: tuple) -> None:
    group = _instance_group("m", 1, InstanceConfig(count=2, device=device))
    assert (group.name, group.count, group.kind, group.gpus) == ("m_1", 2, kind, gpus)


def test_device_names_parse_one_way() -> None:
    assert [cuda_index(d) for d in ("cpu", "cuda", "cuda:0", "cuda:12", "MIG-x", "cudax")] == [
        None, 0, 0, 12, None, None,
    ]  # fmt: skip
    assert is_mig("MIG-x") and not is_mig("cuda:0") and not is_mig("cpu")
