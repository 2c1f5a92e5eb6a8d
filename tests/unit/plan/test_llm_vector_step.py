"""A batch-1 step's matrix-vector MBU apart from the matrix-matrix one: the step formula on
hand-computed figures, its calibration from three decode steps, and the plan's flag."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlscale.cli import main
from dlscale.errors import PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.plan.llm import DecoderShape, from_config
from dlscale.plan.llm_calibrate import AboveCeiling, calibrate
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency
from dlscale.plan.llm_passes import Pass

#: A decoder small enough to count by hand: 2 layers of 64, 4 heads of 16, MLP 128, 100 ids.
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
    "torch_dtype": "float32",
}
#: A CPU of 1 GB/s and 1 GFLOP/s: a step's seconds are its bytes and FLOPs over 1e9.
CPU = replace(load_catalog().get("CPU"), memory_bandwidth=1e9, dense={"fp32": 1e9})
H100 = load_catalog().get("H100-SXM")


def tiny() -> DecoderShape:
    return from_config(TINY, "tiny")


def test_the_shape_counts_what_the_hand_counts() -> None:
    # Per layer: attention 64 x 16 x (8 + 8) = 16,384, MLP 3 x 64 x 128 = 24,576, norms 128:
    # 41,088; x 2 layers + final norm 64 + head 6,400 + the batch's embedding rows (64 each).
    shape = tiny()
    assert shape.step_weight_bytes(1) == (82_176 + 64 + 6_400 + 64) * 4 == 354_816
    assert shape.step_weight_bytes(2) == 355_072
    assert shape.kv_bytes_per_token == 2 * 2 * 4 * 16 * 4 == 1_024
    # 2 x 88,640 active parameters + attention 4 x 2 x 4 x 16 x 10 tokens of context.
    _, flops = DecoderOnDevice(shape, CPU).pass_work(Pass.decode(1, 10))
    assert flops == 177_280 + 5_120 == 182_400


def test_batch_one_streams_the_weights_at_its_own_share_of_bandwidth() -> None:
    on_cpu = DecoderOnDevice(tiny(), CPU, Efficiency(0.25, 0.5, 1e-3, mbu_vector=0.5))
    # Batch 1, context 10: (354,816 + 10,240 KV read + 1,024 written) B at 0.5 GB/s + 182,400
    # FLOP at 0.5 GFLOP/s + 1 ms of host work.
    assert on_cpu.decode_step_s(1, 10) == pytest.approx(366_080 / 5e8 + 182_400 / 5e8 + 1e-3)
    # Batch 2 runs matrix-matrix products: 377,600 B at 0.25 GB/s, 2 x the FLOPs, 2 ms.
    assert on_cpu.decode_step_s(2, 10) == pytest.approx(377_600 / 2.5e8 + 364_800 / 5e8 + 2e-3)
    # A prefill of one token is a matrix-vector pass too; of two, matrix-matrix.
    moved, flops = on_cpu.pass_work(Pass.prompts(1, 1))
    assert on_cpu.prefill_s(1) == pytest.approx(moved / 5e8 + flops / 5e8 + 1e-3)
    moved, flops = on_cpu.pass_work(Pass.prompts(2, 1))
    assert on_cpu.prefill_s(2) == pytest.approx(moved / 2.5e8 + flops / 5e8 + 1e-3)
    # Unset, batch 1 reads at MBU like every batch (the model before it was split).
    one_mbu = replace(on_cpu, efficiency=Efficiency(0.25, 0.5, 1e-3))
    assert one_mbu.decode_step_s(1, 10) == pytest.approx(366_080 / 2.5e8 + 182_400 / 5e8 + 1e-3)
    with pytest.raises(PlanError, match="MBU at batch 1 must be in"):
        Efficiency(0.25, 0.5, mbu_vector=1.5)


#: Llama-3-8B's shape: on an H100 its decode steps are memory-bound and a 2k-token prefill
#: compute-bound, as calibration on a GPU takes them (the tiny decoder is memory-bound there).
LLAMA3 = {**TINY, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
LLAMA3 |= {"num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}


@pytest.mark.parametrize(
    ("device", "config", "prompt"),
    [(CPU, TINY, 32), (H100, LLAMA3, 2048)],
    ids=["cpu-sum", "gpu-roofline"],
)
def test_three_decode_steps_recover_batch_ones_mbu_apart(
    device: object, config: dict[str, object], prompt: int
) -> None:
    truth = Efficiency(0.3, 0.6, 5e-4, mbu_vector=0.45)
    assert isinstance(device, type(CPU))
    made = DecoderOnDevice(from_config(config, "m"), device, truth)
    base = replace(made, efficiency=Efficiency(1.0, 1.0))
    steps = [(b, 40.0, made.decode_step_s(b, 40.0)) for b in (1, 2, 16)]
    got = calibrate(base, steps, (prompt, 1, made.prefill_s(prompt)))
    assert (got.mbu_vector, got.mbu, got.mfu, got.host_s_per_token) == pytest.approx(
        (0.45, 0.3, 0.6, 5e-4), rel=1e-6
    )
    # Two steps: one MBU for every batch, as before.
    two = calibrate(base, [steps[0], steps[2]], (prompt, 1, made.prefill_s(prompt)))
    assert two.mbu_vector is None


def test_calibration_refuses_what_cannot_be_solved() -> None:
    base = DecoderOnDevice(tiny(), CPU, Efficiency(1.0, 1.0))
    with pytest.raises(PlanError, match="one must be batch 1"):
        calibrate(base, [(2, 40.0, 1.0), (4, 40.0, 1.5), (8, 40.0, 2.0)], (32, 1, 1.0))
    with pytest.raises(PlanError, match="1 to 3 decode steps"):
        calibrate(base, [], (32, 1, 1.0))
    # Batch 1 faster than the device's peak bandwidth allows: an MBU above 1 is refused.
    made = DecoderOnDevice(tiny(), CPU, Efficiency(0.3, 0.6, 5e-4, mbu_vector=0.45))
    steps = [(b, 40.0, made.decode_step_s(b, 40.0)) for b in (1, 2, 16)]
    steps[0] = (1, 40.0, made.decode_step_s(1, 40.0) - 365_056 / 0.45e9 * 0.9)
    with pytest.raises(PlanError, match=r"MBU at batch 1 .* exceed 1"):
        calibrate(base, steps, (32, 1, made.prefill_s(32)))


def test_plan_serve_takes_batch_ones_mbu(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "serve", "--model", "llama-small", "--rate", "5", "--isl", "64"]
    argv += ["--osl", "16", "--devices", "H100-SXM", "--mbu", "0.5", "--mbu-vector", "0.7"]
    assert main(argv) == 0
    assert "MBU 0.5, MFU 0.8, fp32, MBU at batch 1 0.7" in capsys.readouterr().out
    assert main([*argv[:-1], "1.7"]) == 1
    assert "MBU at batch 1 must be in (0, 1], got 1.7" in capsys.readouterr().err


def test_a_host_time_below_zero_is_fitted_as_zero() -> None:
    # An engine with no host work per token, its batch-16 step measured 2% fast: solved
    # exactly, the host time would be negative; it is 0 and the rest fitted to the times.
    made = DecoderOnDevice(tiny(), CPU, Efficiency(0.3, 0.6, 0.0, mbu_vector=0.45))
    base = replace(made, efficiency=Efficiency(1.0, 1.0))
    steps = [(b, 40.0, made.decode_step_s(b, 40.0)) for b in (1, 2, 16)]
    steps[2] = (16, 40.0, steps[2][2] * 0.98)
    got = calibrate(base, steps, (32, 1, made.prefill_s(32)))
    assert got.host_s_per_token == 0.0
    assert (got.mbu_vector, got.mbu, got.mfu) == pytest.approx((0.45, 0.3, 0.6), rel=0.1)
    fitted = replace(base, efficiency=got)
    assert fitted.decode_step_s(16, 40.0) == pytest.approx(steps[2][2], rel=0.02)


def test_times_faster_than_the_device_allows_carry_the_shares_found() -> None:
    # Twice the peaks' speed everywhere: the refusal says by how much, for a caller that
    # measured the device's figures itself (benchmarks/plan_llm_check.py raises them).
    made = DecoderOnDevice(tiny(), CPU, Efficiency(1.0, 1.0, 0.0, mbu_vector=1.0))
    base = replace(made, efficiency=Efficiency(1.0, 1.0))
    steps = [(b, 40.0, made.decode_step_s(b, 40.0) / 2) for b in (1, 2, 16)]
    with pytest.raises(AboveCeiling) as refused:
        calibrate(base, steps, (32, 1, made.prefill_s(32) / 2))
    above = refused.value
    assert (above.mbu, above.mfu, above.mbu_vector) == pytest.approx((2.0, 2.0, 2.0))
