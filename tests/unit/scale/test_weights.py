"""Routing by work: the weight of each replica from the compute time it measured per row."""

from __future__ import annotations

from dlscale.scale.weights import MAX_WEIGHT, MIN_ROWS, Weigher, Work


def test_a_replica_three_times_slower_gets_a_third_of_the_weight() -> None:
    weigher = Weigher()
    weigher.weights({"fast": Work(0, 0), "slow": Work(0, 0)})
    weights = weigher.weights({"fast": Work(300, 300_000), "slow": Work(100, 300_000)})
    assert weights == {"fast": MAX_WEIGHT, "slow": round(MAX_WEIGHT / 3)}


def test_an_unmeasured_replica_gets_the_most_weight_to_be_measured() -> None:
    weigher = Weigher()
    weigher.weights({"old": Work(0, 0)})
    weights = weigher.weights({"old": Work(100, 1_000_000), "new": Work(0, 0)})
    assert weights == {"old": MAX_WEIGHT, "new": MAX_WEIGHT}


def test_too_few_rows_keep_the_weight_until_the_interval_has_enough() -> None:
    weigher = Weigher()
    weigher.weights({"a": Work(0, 0), "b": Work(0, 0)})
    weigher.weights({"a": Work(100, 100_000), "b": Work(100, 200_000)})
    # b answers a trickle at a tenth of the time per row: too few rows to read yet ...
    few = MIN_ROWS - 1
    trickle = weigher.weights({"a": Work(200, 200_000), "b": Work(100 + few, 200_000 + few * 100)})
    assert trickle["b"] == MAX_WEIGHT // 2
    # ... then, with enough rows since the last reading, its new speed counts.
    weights = weigher.weights(
        {"a": Work(300, 300_000), "b": Work(100 + 2 * few, 200_000 + 2 * few * 100)}
    )
    assert weights["b"] == MAX_WEIGHT and weights["a"] == round(MAX_WEIGHT / 10)


def test_a_restarted_replica_starts_over_and_a_gone_one_is_forgotten() -> None:
    weigher = Weigher()
    weigher.weights({"a": Work(0, 0), "b": Work(0, 0)})
    weigher.weights({"a": Work(100, 100_000), "b": Work(100, 300_000)})
    weights = weigher.weights({"a": Work(200, 200_000), "b": Work(5, 50)})  # b's counts restarted
    assert weights["b"] == round(MAX_WEIGHT / 3)  # its last speed stands until measured again
    assert weigher.weights({"a": Work(300, 300_000)}) == {"a": MAX_WEIGHT}
    assert set(weigher.ns_per_row) == {"a"}


def test_with_batching_a_slower_replica_gets_less_than_its_speed_ratio() -> None:
    """The fast replica batches 4 rows: 8 requests queued on it wait as long as one alone on a
    replica 3x slower, so leastconn must send it 9 for each one the slow replica gets."""
    weigher = Weigher()
    weigher.weights({"fast": Work(0, 0, 4), "slow": Work(0, 0, 4)})
    weights = weigher.weights({"fast": Work(300, 300_000, 4), "slow": Work(100, 300_000, 4)})
    assert weights == {"fast": MAX_WEIGHT, "slow": round(MAX_WEIGHT / 9)}


def test_equal_speeds_keep_equal_weights_whatever_the_batch() -> None:
    weigher = Weigher()
    weigher.weights({"a": Work(0, 0, 8), "b": Work(0, 0, 1)})
    weights = weigher.weights({"a": Work(100, 100_000, 8), "b": Work(100, 100_000, 1)})
    assert weights == {"a": MAX_WEIGHT, "b": MAX_WEIGHT}


def _pair_at(rate: float, follow_load: bool = True) -> tuple[Weigher, dict[str, int]]:
    """A fast replica (50 ms per batch of up to 4 rows) and one 3x slower, read 2 s apart while
    the pair carried `rate` rows/s, nine in ten of them on the fast one. Their light-load
    capacity is 80 + 6.7 rows/s (the slow one fed one row per batch)."""
    weigher = Weigher(follow_load)
    weigher.weights({"fast": Work(0, 0, 4, at=10.0), "slow": Work(0, 0, 4, at=10.0)})
    fast, slow = round(rate * 2 * 0.9), round(rate * 2 * 0.1)
    weights = weigher.weights(
        {
            "fast": Work(fast, fast * 50_000_000, 4, at=12.0),
            "slow": Work(slow, slow * 150_000_000, 4, at=12.0),
        }
    )
    return weigher, weights


def test_under_light_load_the_batching_weight_holds() -> None:
    weigher, weights = _pair_at(60.0)
    assert weigher.load < 0.8
    assert weights == {"fast": MAX_WEIGHT, "slow": round(MAX_WEIGHT / 9)}


def test_under_heavy_load_the_slower_replica_gets_its_speed_ratio() -> None:
    """At 90 rows/s the fast replica cannot carry what the batching weight leaves it (the slow
    one fed one row per batch): long queues on both, where equal waits need the speed ratio."""
    weigher, weights = _pair_at(90.0)
    assert weigher.load > 1.0
    assert weights == {"fast": MAX_WEIGHT, "slow": round(MAX_WEIGHT / 3)}


def test_in_between_the_weight_moves_from_one_to_the_other() -> None:
    weigher, weights = _pair_at(80.0)  # 0.92 of the light-load capacity: halfway
    assert 0.9 < weigher.load < 0.95
    assert round(MAX_WEIGHT / 9) < weights["slow"] < round(MAX_WEIGHT / 3)


def test_without_following_the_load_the_batching_weight_holds_at_any_load() -> None:
    _, weights = _pair_at(90.0, follow_load=False)
    assert weights["slow"] == round(MAX_WEIGHT / 9)
