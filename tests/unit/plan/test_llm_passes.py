"""An engine's passes: a burst scheduled under a token budget as transformers' continuous
batching ran it, dense attention's bytes and FLOPs counted by hand, the host's time per
sequence, layer and request, and their calibration from two model sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlscale.cli import main
from dlscale.errors import PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.plan.llm import DecoderShape, from_config
from dlscale.plan.llm_calibrate import Measured, fit
from dlscale.plan.llm_capacity import DecoderOnDevice, Efficiency, TokenLoad, operating_point
from dlscale.plan.llm_passes import Pass, Scheduling, burst, tpot_weights, ttft_weights

#: 2 layers of 64, 4 heads of 16 (2 KV heads), MLP 128, 100 ids: counted by hand below.
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
    "torch_dtype": "float32",
}
#: The same width at 6 layers and a 4x wider MLP: a second size whose layers and weights do
#: not grow in proportion.
LARGER = {**SMALL, "num_hidden_layers": 6, "intermediate_size": 512}
#: A CPU of 1 GB/s and 1 GFLOP/s: a pass's seconds are its bytes and FLOPs over 1e9.
CPU = replace(load_catalog().get("CPU"), memory_bandwidth=1e9, dense={"fp32": 1e9})
TRANSFORMERS = Scheduling(step_tokens=256, dense_attention=True)


def shape(config: dict[str, object]) -> DecoderShape:
    return from_config(config, "m")


def test_a_burst_fills_each_pass_decoding_first_then_prompt_tokens_up_to_the_budget() -> None:
    # 16 prompts of 65 tokens, 256 tokens per pass: the passes transformers 5.24's FIFO
    # scheduler ran for dlscale's backend (tokens, sequences), profiled 2026-11-29.
    done = burst(TRANSFORMERS, 16, 65, 16)
    got = [(p.tokens, p.sequences) for p in done.passes]
    assert got[:6] == [(256, 4), (256, 8), (256, 12), (256, 16), (52, 16), (16, 16)]
    assert len(got) == 20
    # The 4th request's prompt is split (61 tokens, then 4): its first token comes from pass 1.
    assert done.first[:5] == [0, 0, 0, 1, 1]
    assert max(done.first) == 4 and done.last[0] == 15 and max(done.last) == 19
    # The second pass: 3 decode tokens attending to 65 cached each, the split prompt's last 4
    # tokens after its 61, three whole prompts, and 54 tokens of the eighth.
    second = done.passes[1]
    assert second.cached == 3 * 65 + 61
    assert second.attended == 3 * 65 + (4 * 61 + 10) + 3 * (65 * 66 / 2) + 54 * 55 / 2
    assert [(p.tokens, p.sequences) for p in burst(TRANSFORMERS, 8, 65, 16).passes[:3]] == [
        (256, 4),
        (256, 8),
        (18, 8),
    ]
    # No budget: every prompt in one pass, then one decode step per later token.
    whole = burst(Scheduling(), 16, 65, 16)
    assert [(p.tokens, p.sequences) for p in whole.passes[:2]] == [(1040, 16), (16, 16)]
    assert len(whole.passes) == 16
    with pytest.raises(PlanError, match="at least 1"):
        Scheduling(step_tokens=0)


def test_ttft_and_tpot_weigh_the_passes_each_request_waits_for() -> None:
    done = burst(TRANSFORMERS, 16, 65, 16)
    # TTFT: the last request's first token, after passes 0-4.
    assert ttft_weights(done) == [1.0] * 5 + [0.0] * 15
    tpot = tpot_weights(done, 16)
    # Each request's 15 later tokens, averaged: the weights sum to 1 step.
    assert sum(tpot) == pytest.approx(1.0)
    # Pass 1 carries the later tokens of the 3 requests whose prompts ended in pass 0.
    assert tpot[1] == pytest.approx(3 / (16 * 15))
    assert tpot[19] == pytest.approx(1 / (16 * 15))  # the last request's last token
    alone = burst(Scheduling(), 1, 65, 16)
    assert tpot_weights(alone, 16) == [0.0] + [1 / 15] * 15
    assert tpot_weights(alone, 1) == [0.0] * 16


def test_dense_attention_reads_every_key_of_the_pass_for_every_token() -> None:
    per_sequence = DecoderOnDevice(shape(SMALL), CPU, Efficiency(1.0, 1.0))
    dense = replace(per_sequence, scheduling=Scheduling(dense_attention=True))
    work = Pass.decode(2, 10)  # 2 sequences of 10 cached tokens each
    m = shape(SMALL)
    # Per layer: attention 64 x 16 x (8 + 4) = 12,288, MLP 3 x 64 x 128 = 24,576, norms 128:
    # 36,992; x 2 + final norm 64 + head 6,400 + 2 embedding rows: 80,576 weights read.
    weights = (73_984 + 64 + 6_400 + 128) * 4
    assert m.step_weight_bytes(2) == weights
    kv = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16, FP32: 512 B per token
    active = 73_984 + 64 + 6_400
    # Per sequence: the 20 cached tokens read and 2 written; each token scores its own 10.
    assert per_sequence.pass_work(work) == (weights + 22 * kv, 2 * 2 * active + 4 * 2 * 64 * 20)
    # Dense: the pass's 22 keys gathered (read and written) and expanded to 4 heads from 2
    # (written and read: 2 x 2 more), and both tokens score all 22.
    assert dense.pass_work(work) == (weights + 22 * kv * 6, 2 * 2 * active + 4 * 2 * 64 * 44)


def test_a_pass_pays_the_host_per_sequence_and_per_layer_and_prompts_split_by_the_budget() -> None:
    eff = Efficiency(0.5, 0.5, host_s_per_token=1e-4, host_s_per_layer=1e-3)
    chunked = DecoderOnDevice(shape(SMALL), CPU, eff, scheduling=Scheduling(step_tokens=64))
    work = Pass.decode(4, 10)
    moved, flops = chunked.pass_work(work)
    assert chunked.pass_s(work) == pytest.approx(moved / 5e8 + flops / 5e8 + 4e-4 + 2e-3)
    # 100 prompt tokens under a budget of 64: two passes, the weights read and the layers
    # dispatched twice; the second chunk attends to the first's 64 tokens too.
    two = chunked.pass_s(Pass.prompt(64)) + chunked.pass_s(Pass.prompt(36, 64))
    assert chunked.prefill_s(100) == pytest.approx(two)
    whole = replace(chunked, scheduling=Scheduling())
    assert whole.prefill_s(100) == pytest.approx(whole.pass_s(Pass.prompt(100)))
    assert chunked.prefill_s(100) > whole.prefill_s(100)


def test_the_steady_state_charges_each_request_its_admission() -> None:
    eff = Efficiency(0.5, 0.5, host_s_per_request=2e-3)
    on_cpu = DecoderOnDevice(shape(SMALL), CPU, eff)
    load = TokenLoad(1.0, 32, 8, 10.0, 10.0)
    point = operating_point(on_cpu, load, 4)
    step, prefill = on_cpu.decode_step_s(4, 36), on_cpu.prefill_s(32)
    assert point.ttft_s == pytest.approx(2e-3 + prefill + step)
    assert point.tpot_s == pytest.approx(step + 4 / 8 * (prefill + 2e-3))
    with pytest.raises(PlanError, match="per request must be in"):
        Efficiency(host_s_per_request=-1.0)


def _bursts(made: DecoderOnDevice, batches: tuple[int, ...]) -> list[Measured]:
    """Each batch's TPOT, and TTFT at the ends, as plan_llm_check measures them."""
    out = []
    for batch in batches:
        done = burst(made.scheduling, batch, 65, 16)
        for weights in (tpot_weights(done, 16), ttft_weights(done)):
            seconds = sum(made.pass_s(p) * w for p, w in zip(done.passes, weights, strict=True))
            if weights[0]:  # the TTFT: every request admitted first
                if batch not in (batches[0], batches[-1]):
                    continue
                seconds += batch * made.efficiency.host_s_per_request
            out.append(Measured(done.passes, seconds, weights, batch if weights[0] else 0))
    return out


def test_two_sizes_tell_the_host_per_layer_from_the_weights_reads() -> None:
    truth = Efficiency(0.3, 0.6, 2e-4, 0.45, 5e-4, 3e-3)
    measured = []
    for config in (SMALL, LARGER):
        made = DecoderOnDevice(shape(config), CPU, truth, scheduling=TRANSFORMERS)
        base = replace(made, efficiency=Efficiency(1.0, 1.0))
        measured += [(base, m) for m in _bursts(made, (1, 2, 16))]
    got = fit(measured[0][0], measured)
    assert (got.mbu_vector, got.mbu, got.mfu) == pytest.approx((0.45, 0.3, 0.6), rel=1e-6)
    assert (got.host_s_per_token, got.host_s_per_layer, got.host_s_per_request) == pytest.approx(
        (2e-4, 5e-4, 3e-3), rel=1e-6
    )


def test_plan_serve_takes_the_engines_scheduling(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "serve", "--model", "llama-small", "--rate", "5", "--isl", "300"]
    argv += ["--osl", "16", "--devices", "H100-SXM", "--step-tokens", "256", "--dense-attention"]
    argv += ["--host-us-layer", "500", "--host-us-request", "3000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "host 500 us/layer per pass, host 3e+03 us/request, 256 tokens per pass" in out
    assert "dense attention" in out


def test_an_engine_that_steps_before_the_burst_is_in_prefills_the_rest_in_its_second_pass() -> None:
    # vLLM's engine core, requests sent one by one (a probe of its products' rows, 2026-11-29):
    # 65 rows, then 976 (15 prompts and the first request's first decode), then decode steps.
    vllm = Scheduling(first_pass_requests=1)
    done = burst(vllm, 16, 65, 16)
    assert [(p.tokens, p.sequences) for p in done.passes[:3]] == [(65, 1), (976, 16), (16, 16)]
    assert done.first == [0] + [1] * 15 and len(done.passes) == 17
    # The TTFT counts both prefill passes; every request in at once needs one.
    assert ttft_weights(done)[:3] == [1.0, 1.0, 0.0]
    assert [(p.tokens, p.sequences) for p in burst(Scheduling(), 16, 65, 16).passes[:2]] == [
        (1040, 16),
        (16, 16),
    ]
    with pytest.raises(PlanError, match="a request at least"):
        Scheduling(first_pass_requests=0)
