"""Measured kernels: a curve of the weights' products by rows, read between and past its
points, priced into a pass in place of the roofline's weight terms, and its share of speed
calibrated from two model sizes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.plan.test_llm_passes import CPU, LARGER, SMALL

from dlscale.cli import main
from dlscale.errors import PlanError
from dlscale.plan.llm import DecoderShape, from_config
from dlscale.plan.llm_calibrate import (
    PER_BURST,
    PER_LAYER,
    PER_REQUEST,
    PER_SEQUENCE,
    Measured,
    fit,
)
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency
from dlscale.plan.llm_kernels import (
    KernelCurve,
    Kernels,
    layer_products,
    read_kernels,
    write_kernels,
)
from dlscale.plan.llm_passes import Pass, Scheduling, burst, tpot_weights, ttft_weights

#: Milliseconds by rows as llama-mid's products ran on torch's FP32 linear, one core
#: (2026-11-29): 2 and 3 rows slower than 4.
TORCH_LIKE = KernelCurve(
    (1, 2, 3, 4, 8, 16, 64), (23e-3, 37e-3, 46e-3, 33e-3, 39e-3, 50e-3, 128e-3)
)
HEAD = KernelCurve((1, 16), (1e-3, 2e-3))


def shape(config: dict[str, object]) -> DecoderShape:
    return from_config(config, "m")


def test_a_curve_is_read_between_its_points_and_past_the_last_by_the_last_slope() -> None:
    assert TORCH_LIKE.at(4) == pytest.approx(33e-3)
    assert TORCH_LIKE.at(6) == pytest.approx(36e-3)  # halfway from 4 (33) to 8 (39)
    # Past 64 rows: (128 - 50) / (64 - 16) = 1.625 ms a row more.
    assert TORCH_LIKE.at(256) == pytest.approx(128e-3 + 192 * 1.625e-3)
    assert TORCH_LIKE.at(0) == 0.0
    kept = KernelCurve.from_lists(TORCH_LIKE.as_lists())
    assert kept == TORCH_LIKE


@pytest.mark.parametrize(
    ("rows", "seconds", "why"),
    [
        ((2, 4), (1.0, 2.0), "ascend from 1"),
        ((1, 4, 4), (1.0, 2.0, 3.0), "ascend from 1"),
        ((1, 4), (1.0,), "as many times"),
        ((1,), (1.0,), "two at least"),
        ((1, 4), (1.0, 0.0), "positive"),
    ],
)
def test_a_curve_that_no_kernel_could_have_made_is_refused(
    rows: tuple[int, ...], seconds: tuple[float, ...], why: str
) -> None:
    with pytest.raises(PlanError, match=why):
        KernelCurve(rows, seconds)


def test_the_layers_take_the_pass_tokens_and_the_head_one_row_per_sequence() -> None:
    kernels = Kernels(TORCH_LIKE, HEAD)
    # 16 prompt tokens of one sequence: the layers at 16 rows, the head at 1.
    assert kernels.seconds(Pass.prompt(16)) == pytest.approx(50e-3 + 1e-3)
    # 4 decode tokens: 4 rows through both.
    assert kernels.seconds(Pass.decode(4, 10)) == pytest.approx(33e-3 + (1 + 3 / 15) * 1e-3)


def test_layer_products_follow_the_engines_layout() -> None:
    m = shape(SMALL)  # q 64, k and v 32 each (2 KV heads of 16), MLP 128
    assert layer_products(m, fused=False) == [
        (64, 64),
        (32, 64),
        (32, 64),
        (64, 64),
        (128, 64),
        (128, 64),
        (64, 128),
    ]
    assert layer_products(m, fused=True) == [(128, 64), (64, 64), (256, 64), (64, 128)]
    moe = {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}
    with pytest.raises(PlanError, match="mixture"):
        layer_products(shape(moe), fused=False)


def test_a_pass_prices_its_weights_by_the_curve_and_the_rest_by_the_device() -> None:
    eff = Efficiency(1.0, 1.0, host_s_per_token=1e-4, host_s_per_layer=1e-3, kernel_share=0.5)
    timed = DecoderOnDevice(shape(SMALL), CPU, eff, kernels=Kernels(TORCH_LIKE, HEAD))
    work = Pass.decode(4, 10)
    kv = 2 * 2 * 2 * 16 * 4  # 512 B per token
    # Left of the roofline: 4 embedding rows gathered, 44 keys read or written, and the
    # attention's FLOPs (each token scores its own 10 keys); no weight reads or products.
    moved, flops = timed.pass_work(work)
    assert (moved, flops) == (4 * 64 * 4 + 44 * kv, 4 * 2 * 4 * 16 * 40)
    kernel = (33e-3 + (1 + 3 / 15) * 1e-3) / 0.5
    host = 4 * 1e-4 + 2 * 1e-3
    assert timed.pass_s(work) == pytest.approx(moved / 1e9 + flops / 1e9 + kernel + host)
    with pytest.raises(PlanError, match="kernels' share"):
        Efficiency(kernel_share=0.0)


def test_a_kernel_slower_at_two_rows_than_at_four_makes_batch_two_the_slower_step() -> None:
    timed = DecoderOnDevice(
        shape(SMALL), CPU, Efficiency(1.0, 1.0), kernels=Kernels(TORCH_LIKE, HEAD)
    )
    assert timed.decode_step_s(2, 72) > timed.decode_step_s(4, 72) > timed.decode_step_s(1, 72)
    roofline = replace(timed, kernels=None)  # the roofline's step grows with the batch
    assert roofline.decode_step_s(2, 72) < roofline.decode_step_s(4, 72)


def test_two_sizes_calibrate_the_kernels_share_and_the_hosts_times() -> None:
    truth = Efficiency(0.5, 1.0, 2e-4, None, 5e-4, 1e-3, kernel_share=0.8, host_s_per_burst=2e-3)
    larger = KernelCurve(TORCH_LIKE.rows, tuple(3 * s for s in TORCH_LIKE.seconds))
    measured = []
    for config, curve in ((SMALL, TORCH_LIKE), (LARGER, larger)):
        scheduling = Scheduling(step_tokens=256, dense_attention=True)
        kernels = Kernels(curve, HEAD)
        made = DecoderOnDevice(shape(config), CPU, truth, scheduling=scheduling, kernels=kernels)
        base = replace(made, efficiency=Efficiency(1.0, 1.0))
        for batch in (1, 16):
            done = burst(scheduling, batch, 65, 16)
            tpot, ttft = tpot_weights(done, 16), ttft_weights(done)
            # A TTFT: the burst woke the idle engine once, then each request was admitted.
            for weights, requests, bursts in ((tpot, 0, 0), (ttft, batch, 1)):
                seconds = sum(made.pass_s(p) * w for p, w in zip(done.passes, weights, strict=True))
                seconds += requests * truth.host_s_per_request + bursts * truth.host_s_per_burst
                measured.append((base, Measured(done.passes, seconds, weights, requests, bursts)))
    got = fit(measured[0][0], measured, host=(PER_SEQUENCE, PER_LAYER, PER_REQUEST, PER_BURST))
    # The rest's reads (dense attention's copies of the keys) at their own MBU; its FLOPs at
    # the device's peak.
    assert (got.mbu, got.mfu, got.mbu_vector) == (pytest.approx(0.5, rel=1e-6), 1.0, None)
    assert got.kernel_share == pytest.approx(0.8, rel=1e-6)
    hosts = (got.host_s_per_token, got.host_s_per_layer, got.host_s_per_request)
    assert (*hosts, got.host_s_per_burst) == pytest.approx((2e-4, 5e-4, 1e-3, 2e-3), rel=1e-6)
    with pytest.raises(PlanError, match="per burst"):
        Efficiency(host_s_per_burst=-1e-3)


def test_plan_serve_prices_the_weights_by_a_kernels_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kernels.json"
    write_kernels(Kernels(TORCH_LIKE, HEAD), path)
    assert read_kernels(path) == Kernels(TORCH_LIKE, HEAD)
    argv = ["plan", "serve", "--model", "llama-small", "--rate", "5", "--isl", "64", "--osl", "16"]
    argv += ["--devices", "H100-SXM", "--kernels", str(path), "--kernel-share", "0.5"]
    assert main(argv) == 0
    assert "weights' products as timed (share 0.5)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json", "cannot read"),
        ('{"layers": [[1, 2], [0.1, 0.2]]}', "want"),
        ('{"layers": [[2, 4], [0.1, 0.2]], "head": [[1, 2], [0.1, 0.2]]}', "ascend from 1"),
        ('{"layers": 3, "head": [[1, 2], [0.1, 0.2]]}', "want"),
    ],
)
def test_a_kernels_file_that_holds_no_curves_is_refused_with_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str
) -> None:
    path = tmp_path / "kernels.json"
    path.write_text(text)
    argv = ["plan", "serve", "--model", "llama-small", "--rate", "5", "--isl", "64", "--osl", "16"]
    assert main([*argv, "--devices", "H100-SXM", "--kernels", str(path)]) != 0
    assert why in capsys.readouterr().err


def test_reads_faster_than_the_device_allows_are_priced_at_the_devices_bandwidth() -> None:
    # Measured on a device of 2 GB/s, fitted against one of 1 GB/s: the rest's reads would
    # need an MBU of 2, so they stay at the device's figure and the kernels carry the fit.
    truth = Efficiency(1.0, 1.0, 2e-4, None, 5e-4, kernel_share=0.8)
    faster = replace(CPU, memory_bandwidth=2e9)
    measured = []
    for config in (SMALL, LARGER):
        made = DecoderOnDevice(shape(config), faster, truth, kernels=Kernels(TORCH_LIKE, HEAD))
        base = replace(made, device=CPU, efficiency=Efficiency(1.0, 1.0))
        for batch in (1, 4, 16):
            work = Pass.decode(batch, 72)
            measured.append((base, Measured([work], made.pass_s(work))))
    got = fit(measured[0][0], measured, host=(PER_SEQUENCE, PER_LAYER))
    assert got.mbu == 1.0
    assert 0 < got.kernel_share <= 4
