"""The eviction rule on fake sizes and a clock: least recently used idle models first; pinned,
in-use and held models never; a model above the whole budget refused; the figures in words."""

from __future__ import annotations

import pytest

from dlscale.errors import ConfigError
from dlscale.serving.memory.policy import MemoryFull, Resident, TooLarge, make_room
from dlscale.serving.memory.sizes import device_key, parse_budget, parse_limit, parse_size, show

MiB = 2**20


def _resident(*specs: tuple[str, int, float]) -> list[Resident]:
    return [Resident(name, {"cpu": size * MiB}, used) for name, size, used in specs]


def test_sizes_and_budgets_parse_as_written() -> None:
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512 MB") == 512 * 10**6
    assert parse_size("1.5KiB") == 1536
    assert parse_size(4096) == 4096
    assert parse_budget("cpu=8GiB, gpu0=60GiB") == {"cpu": 8 * 2**30, "gpu0": 60 * 2**30}
    assert parse_budget("cuda:1=1GiB") == {"gpu1": 2**30}
    assert device_key("cuda") == "gpu0" and device_key("cpu") == "cpu"
    assert show(3 * MiB // 2) == "1.5 MiB"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("cpu", "DEVICE=SIZE"),
        ("tpu0=1GiB", "DEVICE=SIZE"),
        ("cpu=1GiB,cpu=2GiB", "named twice"),
        ("cpu=lots", "a number and a unit"),
        ("cpu=1PB", "a number and a unit"),
    ],
)
def test_a_bad_budget_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_budget(text)


def test_a_models_limit_names_its_devices() -> None:
    assert parse_limit("m", {"cpu": "1MiB", "cuda:0": 5}) == {"cpu": MiB, "gpu0": 5}
    with pytest.raises(ConfigError, match="model 'm': \\[memory\\] limit names device 'gpu'"):
        parse_limit("m", {"gpu": "1GiB"})
    with pytest.raises(ConfigError, match="model 'm': \\[memory\\] limit: memory size 'big'"):
        parse_limit("m", {"cpu": "big"})


def test_it_fits_without_evicting() -> None:
    resident = _resident(("a", 10, 1.0), ("b", 10, 2.0))
    assert make_room("c", {"cpu": 10 * MiB}, {"cpu": 30 * MiB}, resident) == []


def test_the_least_recently_used_go_first_and_no_more_than_needed() -> None:
    resident = _resident(("a", 10, 3.0), ("b", 10, 1.0), ("c", 10, 2.0), ("d", 10, 4.0))
    victims = make_room("e", {"cpu": 15 * MiB}, {"cpu": 40 * MiB}, resident)
    assert [v.name for v in victims] == ["b", "c"]  # 15 MiB short: two of 10 free enough


def test_pinned_in_use_and_held_models_are_never_chosen() -> None:
    resident = _resident(("pinned", 10, 1.0), ("busy", 10, 2.0), ("step", 10, 3.0))
    resident += _resident(("idle", 10, 4.0))
    resident[0].pinned, resident[1].in_use, resident[2].held = True, 2, True
    victims = make_room("new", {"cpu": 10 * MiB}, {"cpu": 40 * MiB}, resident)
    assert [v.name for v in victims] == ["idle"]


def test_a_model_that_cannot_fit_now_is_refused_with_the_figures() -> None:
    resident = _resident(("pinned", 20, 1.0), ("busy", 15, 2.0))
    resident[0].pinned, resident[1].in_use = True, 1
    with pytest.raises(MemoryFull) as refused:
        make_room("new", {"cpu": 10 * MiB}, {"cpu": 40 * MiB}, resident)
    text = str(refused.value)
    for words in (
        "'new'",
        "needs cpu 10.0 MiB",
        "budget is cpu 40.0 MiB",
        "cpu 35.0 MiB is resident",
        "pinned (cpu 20.0 MiB, pinned)",
        "busy (cpu 15.0 MiB, in use by 1 request(s))",
    ):
        assert words in text, text
    assert refused.value.http_status == 503 and refused.value.grpc_code == "RESOURCE_EXHAUSTED"


def test_a_model_above_the_whole_budget_is_refused_before_anything_is_evicted() -> None:
    resident = _resident(("a", 10, 1.0))
    with pytest.raises(TooLarge, match=r"needs 50.0 MiB on cpu, above the whole memory budget"):
        make_room("huge", {"cpu": 50 * MiB}, {"cpu": 40 * MiB}, resident)


def test_only_models_on_the_short_device_are_evicted() -> None:
    resident = [
        Resident("on_gpu", {"cpu": 1 * MiB, "gpu0": 30 * MiB}, 1.0),
        Resident("on_cpu", {"cpu": 30 * MiB}, 2.0),
    ]
    budget = {"cpu": 40 * MiB, "gpu0": 40 * MiB}
    victims = make_room("new", {"cpu": 1 * MiB, "gpu0": 20 * MiB}, budget, resident)
    assert [v.name for v in victims] == ["on_gpu"]
    victims = make_room("other", {"cpu": 20 * MiB}, budget, resident)
    assert [v.name for v in victims] == ["on_cpu"]  # on_gpu's 1 MiB of host is not enough


def test_a_device_without_a_budget_is_not_bounded() -> None:
    resident = _resident(("a", 100, 1.0))
    assert make_room("b", {"cpu": 100 * MiB, "gpu0": 5 * MiB}, {"gpu0": 10 * MiB}, resident) == []


def test_a_reload_counts_its_old_versions_but_does_not_evict_itself() -> None:
    resident = _resident(("a", 20, 1.0), ("b", 10, 2.0))
    victims = make_room("a", {"cpu": 20 * MiB}, {"cpu": 45 * MiB}, resident)
    assert [v.name for v in victims] == ["b"]


def _with_adapters(in_use: int = 0) -> list[Resident]:
    """A 40 MiB base (used first) holding two 1 MiB adapters (used last), and a 10 MiB model."""
    base, other, a, b = _resident(("base", 40, 1.0), ("m", 10, 2.0), ("a", 1, 3.0), ("b", 1, 4.0))
    base.holders = frozenset({"a", "b"})
    b.in_use = in_use
    return [base, other, a, b]


def test_an_adapters_base_goes_only_after_all_its_adapters() -> None:
    budget = {"cpu": 60 * MiB}
    # 10 MiB short: the base is the oldest, but its adapters hold it: m goes instead.
    assert [r.name for r in make_room("n", {"cpu": 18 * MiB}, budget, _with_adapters())] == ["m"]
    # 42 MiB short: m, the adapters, then their base (freed by them); m is spared after all.
    victims = make_room("n", {"cpu": 50 * MiB}, budget, _with_adapters())
    assert [r.name for r in victims] == ["a", "b", "base"]


def test_an_adapter_in_use_keeps_its_base() -> None:
    with pytest.raises(
        MemoryFull, match=r"base \(cpu 40.0 MiB, the base of adapters \['a', 'b'\]\)"
    ):
        make_room("n", {"cpu": 50 * MiB}, {"cpu": 60 * MiB}, _with_adapters(in_use=1))
