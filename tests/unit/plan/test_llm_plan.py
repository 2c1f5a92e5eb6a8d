"""The generative planner's arithmetic against hand-computed figures, and its bounded input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dlscale.cli import main
from dlscale.errors import PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.models.zoo.decoder import DECODERS
from dlscale.plan.llm import DecoderShape, from_config, read_config
from dlscale.plan.llm_calibrate import calibrate
from dlscale.plan.llm_capacity import (
    DecoderOnDevice,
    Efficiency,
    TokenLoad,
    operating_point,
    plan_device,
)
from dlscale.plan.llm_commands import decoder_shape
from dlscale.plan.llm_passes import Pass

#: meta-llama/Meta-Llama-3-8B config.json (shared/reference/generative.md, capacity anchors).
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
#: Mixtral-8x7B's shape: 8 experts, 2 per token.
MIXTRAL: dict[str, Any] = {
    **LLAMA3_8B,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
H100 = load_catalog().get("H100-SXM")


def llama3() -> DecoderShape:
    return from_config(LLAMA3_8B, "llama3-8b")


def test_llama3_8b_parameters_and_kv_cache_match_the_reference() -> None:
    shape = llama3()
    assert shape.parameters == 8_030_261_248  # "8B": 8.03e9 by the published shape
    # 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB; 1 GiB holds 8k tokens.
    assert shape.kv_bytes_per_token == 128 * 1024
    assert 8192 * shape.kv_bytes_per_token == 1 << 30
    # A decode step reads every weight but the embedding table (only the batch's rows).
    embedding = 128256 * 4096
    assert shape.step_weight_bytes(1) == (shape.parameters - embedding + 4096) * 2


def test_h100_decode_bound_at_batch_1_is_about_210_tokens_per_second() -> None:
    # Databricks: 16 GB at 3.35 TB/s -> ~210 tokens/s at batch 1 (the whole checkpoint read).
    shape = llama3()
    assert 3.35e12 / shape.weight_bytes == pytest.approx(208.6, abs=0.1)
    on_h100 = DecoderOnDevice(shape, H100, Efficiency(1.0, 1.0))
    step = on_h100.decode_step_s(1, 0)
    # Without the 1.05 GB embedding table the bound is 3.35e12 / 15.01e9 = 223.2 tokens/s
    # (the step also writes its token's 128 KiB of K and V).
    tokens_per_s = 1 / step
    assert tokens_per_s == pytest.approx(3.35e12 / (15_009_857_536 + 131_072), rel=1e-9)
    assert tokens_per_s == pytest.approx(223.2, abs=0.1)
    # Compute at batch 1 is ~16 GFLOP of 989 TFLOP/s: 16 us, far under the 4.5 ms read.
    assert 2 * shape.active_parameters / 989e12 < step / 100


def test_prefill_is_compute_bound_and_counts_causal_attention() -> None:
    shape = llama3()
    on_h100 = DecoderOnDevice(shape, H100, Efficiency(1.0, 1.0))
    moved, flops = on_h100.pass_work(Pass.prompts(1024, 1))
    attention = 4 * 32 * 32 * 128 * 1024 * 1025 / 2
    assert flops == pytest.approx(2 * shape.active_parameters * 1024 + attention)
    assert on_h100.prefill_s(1024) == pytest.approx(flops / 989e12)  # compute-bound
    assert moved / 3.35e12 < flops / 989e12


def test_sequences_that_fit_beside_the_weights() -> None:
    # (80 GB x 0.9 - 16.06 GB) / (1152 tokens x 128 KiB) = 370 sequences on an H100.
    on_h100 = DecoderOnDevice(llama3(), H100, reserve=0.1)
    assert on_h100.max_sequences(1152) == 370
    assert math.floor((80e9 * 0.9 - 16_060_522_496) / (1152 * 131072)) == 370
    big = DecoderOnDevice(from_config({**LLAMA3_8B, "num_hidden_layers": 160}, "big"), H100)
    assert big.max_sequences(1152) == 0  # ~74 GB of weights: more than 90% of 80 GB


def test_mixture_of_experts_counts_active_and_touched_experts() -> None:
    shape = from_config(MIXTRAL, "mixtral")
    assert shape.parameters / 1e9 == pytest.approx(46.70, abs=0.01)  # Mixtral's 46.7B
    assert shape.active_parameters / 1e9 == pytest.approx(12.75, abs=0.01)
    expert = 3 * 4096 * 14336 * 2  # bytes of one expert's MLP
    one, many = shape.step_weight_bytes(1), shape.step_weight_bytes(256)
    # Batch 1 reads 2 of 8 experts per layer; a large batch touches all 8 (uniform routing),
    # and gathers 255 more embedding rows.
    touched = 8 * (1 - (6 / 8) ** 256)
    assert many - one == pytest.approx(32 * (touched - 2) * expert + 255 * 4096 * 2)


def test_calibrate_recovers_the_figures_that_made_the_times() -> None:
    cpu = replace(load_catalog().get("CPU"), memory_bandwidth=20e9)
    shape = read_shape_of("llama-small")
    for device in (cpu, H100):
        for truth in (Efficiency(0.7, 0.4), Efficiency(0.7, 0.4, 800e-6)):
            made = DecoderOnDevice(shape, device, truth)
            decodes = [(1, 80.0), (16, 80.0)] if truth.host_s_per_token else [(1, 80.0)]
            measured = calibrate(
                DecoderOnDevice(shape, device, Efficiency(1.0, 1.0)),
                [(*d, made.decode_step_s(*d)) for d in decodes],
                (64, 1, made.prefill_s(64, 1)),
            )
            got = (measured.mbu, measured.mfu, measured.host_s_per_token)
            assert got == pytest.approx((0.7, 0.4, truth.host_s_per_token), rel=1e-6, abs=1e-12)
    # The CPU adds memory and compute time (and host time per token), a GPU takes the larger.
    on_cpu = DecoderOnDevice(shape, cpu, Efficiency(1.0, 1.0, 1e-3))
    moved, flops = on_cpu.pass_work(Pass.decode(4, 80.0))
    alone = moved / 20e9 + flops / cpu.dense["fp32"]
    assert on_cpu.decode_step_s(4, 80.0) == pytest.approx(alone + 4e-3)
    ideal = replace(on_cpu, efficiency=Efficiency(1.0, 1.0))
    fast = [(1, 80.0, ideal.decode_step_s(1, 80.0) / 2)], (64, 1, ideal.prefill_s(64) / 2)
    with pytest.raises(PlanError, match="MBU 2 / MFU 2 exceed 1"):
        calibrate(ideal, *fast)
    with pytest.raises(PlanError, match="fit no positive MBU"):
        calibrate(ideal, [(1, 80.0, 1e-6)], (64, 1, 1.0))
    with pytest.raises(PlanError, match="do not tell the terms apart"):
        calibrate(ideal, [(4, 80.0, 0.01), (4, 80.0, 0.01)], (64, 1, 1.0))


def read_shape_of(name: str) -> DecoderShape:
    shape = decoder_shape(name, None)
    assert shape is not None
    return shape


def test_zoo_decoders_resolve_by_name_with_the_zoos_parameter_count() -> None:
    for name, model in DECODERS.items():
        assert read_shape_of(name).parameters == model.parameters()
    assert decoder_shape("resnet50", None) is None


def test_the_plan_takes_the_largest_batch_within_both_bounds() -> None:
    on_h100 = DecoderOnDevice(llama3(), H100)
    load = TokenLoad(rate=100, isl=1024, osl=128, ttft_s=2.0, tpot_s=0.030)
    plan = plan_device(on_h100, load)
    assert plan.devices is not None and plan.batch > 1
    assert plan.tpot_s <= 0.030 < operating_point(on_h100, load, plan.batch + 1).tpot_s
    per_device = plan.batch / (plan.ttft_s + 127 * plan.tpot_s)  # Little's law
    assert plan.requests_per_s == pytest.approx(per_device)
    assert plan.devices == math.ceil(100 / per_device)
    assert plan.tokens_per_s == pytest.approx(per_device * 128)
    # More load never needs fewer devices; a tighter TPOT never a larger batch.
    more = plan_device(on_h100, TokenLoad(200, 1024, 128, 2.0, 0.030))
    tighter = plan_device(on_h100, TokenLoad(100, 1024, 128, 2.0, 0.010))
    assert more.devices is not None and more.devices >= plan.devices
    assert tighter.batch < plan.batch
    impossible = plan_device(on_h100, TokenLoad(100, 1024, 128, 2.0, 0.001))
    assert (
        impossible.devices is None and "TPOT" in impossible.basis and "batch 1" in impossible.basis
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1, 2], "JSON object"),
        ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "no hidden_size"),
        ({**LLAMA3_8B, "num_hidden_layers": -3}, "num_hidden_layers must be an integer"),
        ({**LLAMA3_8B, "num_hidden_layers": True}, "num_hidden_layers must be an integer"),
        ({**LLAMA3_8B, "num_hidden_layers": 10**12}, "num_hidden_layers must be an integer"),
        ({**LLAMA3_8B, "hidden_size": "4096"}, "hidden_size must be an integer"),
        ({**LLAMA3_8B, "num_key_value_heads": 5}, "not a multiple of 5"),
        ({**LLAMA3_8B, "num_key_value_heads": 64}, "num_key_value_heads must be"),
        ({**LLAMA3_8B, "torch_dtype": "float64"}, "not one of"),
        ({**MIXTRAL, "num_experts_per_tok": 0}, "needs num_experts_per_tok"),
        ({**MIXTRAL, "num_experts_per_tok": 9}, "num_experts_per_tok must be"),
    ],
)
def test_a_malformed_config_gets_a_clear_error(config: Any, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        from_config(config, "m")


def test_unreadable_or_oversized_config_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PlanError, match="cannot read"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_bytes(b" " * (2 << 20))
    with pytest.raises(PlanError, match="not a model config"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(PlanError, match="cannot read"):
        read_config(tmp_path)


def test_plan_serve_for_a_hugging_face_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "llama3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    out_json = tmp_path / "plans.json"
    argv = [
        "plan", "serve", "--model", str(folder), "--rate", "10", "--isl", "1024", "--osl",
        "128", "--ttft-ms", "500", "--tpot-ms", "30", "--devices", "H100-SXM,L4,T4",
        "--price", "H100-SXM=2.5", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "llama3: 8.03B parameters, bfloat16, 32 layers, KV 128 KiB/token" in out
    assert "skipped: T4 publishes no bf16 peak" in out
    plans = {p["device"]: p for p in json.loads(out_json.read_text())}
    assert plans["H100-SXM"]["devices"] == 1 and plans["H100-SXM"]["batch"] > 100
    assert plans["L4"]["devices"] is None and "TPOT" in plans["L4"]["basis"]
    # $ per million tokens: 1 device x $2.5/h over 10 x 128 tokens/s.
    assert plans["H100-SXM"]["cost_per_million_tokens"] == pytest.approx(2.5 / (1280 * 3600) * 1e6)


def test_plan_serve_generative_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["plan", "serve", "--model", "llama-tiny", "--rate", "1"]) == 1
    assert "give --rate, --isl and --osl" in capsys.readouterr().err
    assert main(["plan", "serve", "--rate", "1", "--isl", "8", "--osl", "8"]) == 1
    assert "--rate plans a generative model" in capsys.readouterr().err
    argv = ["plan", "serve", "--model", "llama-tiny", "--rate", "1", "--isl", "0", "--osl", "8"]
    assert main(argv) == 1
    assert "--isl and --osl must be in" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA3_8B, "vocab_size": -1}))
    assert main(["plan", "serve", "--model", str(tmp_path), "--rate", "1"]) == 1
    assert "vocab_size must be an integer" in capsys.readouterr().err


def test_the_cpu_gets_its_bandwidth_measured(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "serve", "--model", "llama-tiny", "--rate", "5", "--isl", "32", "--osl", "8"]
    assert main([*argv, "--devices", "CPU"]) == 0
    out = capsys.readouterr().out
    assert "llama-tiny: 0.00105B parameters, float32, 4 layers, KV 2 KiB/token" in out
    row = next(line for line in out.splitlines() if line.startswith("CPU "))
    assert row.split()[1].isdigit()  # a device count: the measured bandwidth made a plan
    assert "GB/s measured here" in row
