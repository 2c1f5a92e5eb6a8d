"""The Server run's rate when the user names none: what the warm-up says one-sample queries hold."""

from __future__ import annotations

from dlscale.bench.probe import Probe, default_server_rate


def test_one_sample_at_a_time_bounds_the_rate_when_batches_overstate_it() -> None:
    # The demo's case: 4,600 samples/s in batches of 32, 5 ms for one sample alone.
    assert default_server_rate(Probe(latency_s=0.005, throughput=4600.0)) == 100.0


def test_a_quarter_of_the_batched_throughput_bounds_it_when_that_is_lower() -> None:
    # A model whose batches barely help: 1 ms for one sample, 400 samples/s batched.
    assert default_server_rate(Probe(latency_s=0.001, throughput=400.0)) == 100.0


def test_the_rate_is_never_below_one_query_a_second() -> None:
    assert default_server_rate(Probe(latency_s=30.0, throughput=0.05)) == 1.0


def test_an_unmeasured_latency_falls_back_to_the_throughput() -> None:
    assert default_server_rate(Probe(latency_s=0.0, throughput=80.0)) == 20.0
