"""The torch backend's parts on the CPU: buckets, options, placement, FP8 layers, file formats."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dlscale.backends import BackendOptions, create_backend
from dlscale.backends.half_precision import emulated
from dlscale.backends.torch.buckets import Buckets, default_buckets, pad_rows
from dlscale.backends.torch.device import resolve_device
from dlscale.backends.torch.files import save_exported, save_torchscript, write_module_spec
from dlscale.backends.torch.lowp import LowpConv2d, LowpLinear, fold_batchnorm, to_lowp
from dlscale.backends.torch.options import parse_torch_options, resolve
from dlscale.backends.torch.precision import check_supported, fp8_supported, fp32_mode
from dlscale.backends.torch.tensors import from_numpy, to_numpy
from dlscale.errors import BackendError, ConfigError, InvalidInput
from dlscale.hardware.cpu import read_cpu
from dlscale.types import Datatype, TensorSpec

# -- buckets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_batch", "expected"),
    [(1, (1,)), (8, (1, 2, 4, 8)), (12, (1, 2, 4, 8, 12)), (64, (1, 2, 4, 8, 16, 32, 64))],
)
def test_default_buckets_are_powers_of_two_up_to_the_max(
    max_batch: int, expected: tuple[int, ...]
) -> None:
    assert default_buckets(max_batch) == expected


def test_a_batch_goes_to_the_smallest_bucket_that_holds_it() -> None:
    buckets = Buckets([8, 1, 4, 2, 4])
    assert buckets.sizes == (1, 2, 4, 8)
    assert [buckets.pick(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(InvalidInput, match="above the largest batch bucket 8"):
        buckets.pick(9)
    with pytest.raises(ConfigError):
        Buckets([0, 2])


def test_padding_adds_zero_rows_and_keeps_the_real_ones() -> None:
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2) + 1
    padded = pad_rows(x, 4)
    assert padded.shape == (4, 2)
    assert torch.equal(padded[:3], x) and torch.equal(padded[3], torch.zeros(2))
    assert pad_rows(x, 3) is x


# -- options -------------------------------------------------------------------------------------


def test_options_parse_and_refuse_what_they_do_not_know() -> None:
    options = parse_torch_options(
        {"precision": "bf16", "batch_buckets": [4, 1, 2], "compile": True}
    )
    assert options.precision == "bf16" and options.batch_buckets == (1, 2, 4)
    assert not options.bucketed
    with pytest.raises(ConfigError, match="not torch backend options"):
        parse_torch_options({"precison": "fp16"})
    with pytest.raises(ConfigError, match=r"backend_options.precision: expected one of"):
        parse_torch_options({"precision": "int4"})
    with pytest.raises(ConfigError, match="expected true or false"):
        parse_torch_options({"cuda_graphs": "yes"})
    with pytest.raises(ConfigError, match="captures CUDA graphs itself"):
        parse_torch_options(
            {"compile": True, "compile_mode": "reduce-overhead", "cuda_graphs": True}
        )
    with pytest.raises(ConfigError, match="autocast: needs precision"):
        parse_torch_options({"autocast": True})


# -- placement -----------------------------------------------------------------------------------

MIG = "MIG-3c9c5e2a-0d3f-5b7e-9a1e-2b3c4d5e6f70"


def test_devices_resolve_to_torch_names() -> None:
    assert resolve_device("cpu", {}, False) == ("cpu", None)
    assert resolve_device("cuda", {}, False) == ("cuda:0", None)
    assert resolve_device("cuda:3", {}, True) == ("cuda:3", None)
    with pytest.raises(ConfigError, match="expected cpu, cuda"):
        resolve_device("tpu:0", {}, False)


def test_a_mig_instance_is_made_the_only_visible_device_before_cuda_starts() -> None:
    assert resolve_device(MIG, {}, False) == ("cuda:0", MIG)
    assert resolve_device(MIG, {"CUDA_VISIBLE_DEVICES": "0,1"}, False) == ("cuda:0", MIG)
    # Already the process's visible device: nothing to change, even after CUDA started.
    assert resolve_device(MIG, {"CUDA_VISIBLE_DEVICES": MIG}, True) == ("cuda:0", None)
    with pytest.raises(ConfigError, match=r"already initialized.*one server process per MIG"):
        resolve_device(MIG, {"CUDA_VISIBLE_DEVICES": "0"}, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_a_cuda_device_without_cuda_is_refused_clearly(tmp_path: Path) -> None:
    path = _mlp_spec(tmp_path)
    backend = create_backend("torch", path, BackendOptions(device="cuda:0", max_batch_size=4))
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        backend.load()


def test_settings_left_open_are_chosen_for_the_device() -> None:
    def chosen(extra: dict[str, object], **facts: bool) -> tuple[object, ...]:
        facts = {"on_cuda": True, "can_bucket": True, "convolutional": True} | facts
        s = resolve(parse_torch_options(extra), **facts)
        return s.cuda_graphs, s.channels_last, s.freezing, s.inflight_batches

    # CUDA: graphs per bucket, channels_last for convolutions, freezing, two batches in flight.
    assert chosen({}) == (True, True, True, 2)
    assert chosen({}, convolutional=False) == (True, False, True, 2)
    assert chosen({}, can_bucket=False) == (False, True, True, 2)
    # Inductor's own graphs replace ours and are kept per thread: one batch at a time.
    assert chosen({"compile": True, "compile_mode": "reduce-overhead"}) == (False, True, True, 1)
    assert chosen({"compile_backend": "aot_eager"})[2] is False  # freezing is inductor's
    # The CPU keeps what it had; explicit settings are kept everywhere.
    assert chosen({}, on_cuda=False) == (False, False, False, 1)
    explicit = {"cuda_graphs": False, "channels_last": False, "freezing": False}
    assert chosen(explicit | {"inflight_batches": 3}) == (False, False, False, 3)


# -- precision -----------------------------------------------------------------------------------


def test_fp8_needs_compute_capability_8_9() -> None:
    assert not fp8_supported(None)
    assert not fp8_supported((8, 0)) and not fp8_supported((8, 6))
    assert fp8_supported((8, 9)) and fp8_supported((9, 0)) and fp8_supported((10, 0))
    with pytest.raises(ConfigError, match=r"compute capability 8\.9"):
        check_supported("fp8", torch.device("cpu"))
    with pytest.raises(ConfigError, match="'tf32' is a mode of NVIDIA tensor cores"):
        check_supported("tf32", torch.device("cpu"))


def test_a_16_bit_type_the_cpu_emulates_loads_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert emulated("bf16", frozenset({"avx2", "fma"})) and emulated("fp16", frozenset({"avx2"}))
    assert not emulated("bf16", frozenset({"avx2", "avx512_bf16"}))
    assert not emulated("fp16", frozenset({"amx_fp16"}))
    assert not emulated("fp32", frozenset({"avx2"}))
    assert not emulated("bf16", frozenset())  # flags unknown: no claim either way
    with caplog.at_level(logging.WARNING, logger="dlscale.backends.torch.precision"):
        check_supported("bf16", torch.device("cpu"))
        check_supported("fp32", torch.device("cpu"))
    # This host's own flags decide: a warning only where it has no BF16 dot products.
    warned = [r.getMessage() for r in caplog.records if "emulated" in r.getMessage()]
    expected = emulated("bf16", read_cpu().flags)
    assert len(warned) == int(expected), warned
    assert all("'bf16'" in m and "avx512_bf16" in m for m in warned)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_an_8_bit_linear_stays_close_to_the_linear_it_replaces(kind: str) -> None:
    # torch._scaled_mm and torch._int_mm also run on the CPU, so the 8-bit arithmetic is
    # checked here; the backend itself offers FP8 only on GPUs with FP8 tensor cores.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1000), nn.ReLU(), nn.Linear(1000, 10)).eval()
    x = torch.randn(5, 64)
    dtype = torch.bfloat16 if kind == "fp8" else torch.float16
    with torch.inference_mode():
        expected = model(x)
        converted = model.to(dtype)
        assert to_lowp(converted, kind) == 1  # type: ignore[arg-type]  # 1000 inputs: unaligned
        assert isinstance(converted[0], LowpLinear) and isinstance(converted[2], nn.Linear)
        got = converted(x.to(dtype)).float()
    assert got.shape == expected.shape
    _assert_near(got, expected, 0.1, 0.99)


def _assert_near(got: torch.Tensor, expected: torch.Tensor, bound: float, floor: float) -> None:
    error = float((got - expected).abs().max() / expected.abs().max())
    cosine = float(nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0))
    assert error < bound and cosine > floor, f"relative error {error:.3f}, cosine {cosine:.4f}"


class ConvNet(nn.Module):
    """The convolutions ResNet-50 has: a 7x7 stem, 1x1 and strided 3x3 ones, a strided 1x1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.reduce = nn.Conv2d(16, 32, 1)
        self.spatial = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.down = nn.Conv2d(16, 32, 1, stride=2, bias=False)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        y = self.spatial(torch.relu(self.reduce(x))) + self.down(x)
        return self.fc(y.mean(dim=(2, 3)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize(("convs", "swapped"), [("none", 1), ("pointwise", 3), ("all", 4)])
def test_convolutions_run_as_8_bit_products_in_either_layout(
    kind: str, convs: str, swapped: int
) -> None:
    model = ConvNet().eval()
    with torch.no_grad():  # statistics a trained network would have
        model.bn.running_mean.uniform_(-0.1, 0.1)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32)
    dtype = torch.bfloat16 if kind == "fp8" else torch.float16
    with torch.inference_mode():
        expected = model(x)
        folded = fold_batchnorm(model)
        assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
        torch.testing.assert_close(folded(x), expected, rtol=1e-4, atol=1e-4)
        converted = folded.to(dtype)
        # The 7x7 stem has 3 x 49 = 147 inputs per output, not a multiple of 16: it stays.
        assert to_lowp(converted, kind, convs) == swapped  # type: ignore[arg-type]
        assert sum(isinstance(m, LowpConv2d) for m in converted.modules()) == swapped - 1
        for layout in (torch.contiguous_format, torch.channels_last):
            got = converted(x.to(dtype).contiguous(memory_format=layout)).float()
            _assert_near(got, expected, 0.1, 0.99)


# -- tensors and files ---------------------------------------------------------------------------


def test_bf16_and_read_only_arrays_cross_the_boundary() -> None:
    import ml_dtypes

    array = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    tensor = from_numpy(array)
    assert tensor.dtype == torch.bfloat16 and tensor.tolist() == [0, 1, 2, 3]
    assert to_numpy(tensor).dtype == ml_dtypes.bfloat16
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    assert from_numpy(frozen).sum().item() == 3
    # A received message's bytes are shared, not copied, and torch's warning stays quiet.
    received = np.frombuffer(bytes(12), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = from_numpy(received)
    assert shared.data_ptr() == received.__array_interface__["data"][0]


SPEC_IN = [TensorSpec("x", Datatype.FP32, (-1, 8))]
SPEC_OUT = [TensorSpec("y", Datatype.FP32, (-1, 4))]


class Tiny(nn.Module):
    """x @ W + b, then tanh: small enough to export and script in well under a second."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def _mlp_spec(tmp_path: Path) -> Path:
    path = tmp_path / "model.zoo"
    write_module_spec(path, "dlscale.models.zoo.nets.small:make_mlp", {"seed": 0},
                      [TensorSpec("input", Datatype.FP32, (-1, 256))],
                      [TensorSpec("output", Datatype.FP32, (-1, 10))])  # fmt: skip
    return path


@pytest.mark.parametrize("suffix", [".pt2", ".pt"])
def test_exported_and_scripted_files_load_with_their_signature(tmp_path: Path, suffix: str) -> None:
    module = Tiny().eval()
    example = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    path = tmp_path / f"model{suffix}"
    save = save_exported if suffix == ".pt2" else save_torchscript
    save(module, example, SPEC_IN, SPEC_OUT, path)
    backend = create_backend("torch", path, BackendOptions(max_batch_size=8))
    backend.load()
    assert backend.inputs == SPEC_IN and backend.outputs == SPEC_OUT
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(backend.infer({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)
    backend.unload()


def test_an_exported_file_without_signature_is_described_from_its_graph(tmp_path: Path) -> None:
    program = torch.export.export(
        Tiny().eval(), (torch.zeros(2, 8),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(program, tmp_path / "model.pt2")
    backend = create_backend("torch", tmp_path / "model.pt2", BackendOptions(max_batch_size=4))
    backend.load()
    assert backend.inputs == [TensorSpec("x", Datatype.FP32, (-1, 8))]
    assert backend.outputs == [TensorSpec("output", Datatype.FP32, (-1, 4))]


def test_a_scripted_file_without_signature_is_refused(tmp_path: Path) -> None:
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.zeros(2, 8)), str(tmp_path / "model.pt"))
    backend = create_backend("torch", tmp_path / "model.pt", BackendOptions())
    with pytest.raises(ConfigError, match="save_torchscript"):
        backend.load()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("dlscale.models.zoo.nets.small", "is not one of the zoo's factories"),
        ("dlscale.models.zoo.nets.no_such_module:make", "cannot import"),
        ("builtins:dict", "is not one of the zoo's factories"),
        ("dlscale.models.zoo.nets.small:make_missing", "cannot import"),
    ],
)
def test_a_bad_factory_is_named_in_the_error(tmp_path: Path, factory: str, message: str) -> None:
    path = tmp_path / "model.zoo"
    write_module_spec(path, factory, {}, SPEC_IN, SPEC_OUT)
    with pytest.raises(ConfigError, match=message):
        create_backend("torch", path, BackendOptions()).load()


def test_settings_a_model_cannot_take_are_refused_at_load(tmp_path: Path) -> None:
    path = _mlp_spec(tmp_path)

    def load(**extra: object) -> None:
        create_backend("torch", path, BackendOptions(max_batch_size=4, extra=extra)).load()

    with pytest.raises(ConfigError, match="channels_last: needs a 4-D"):
        load(channels_last=True)
    with pytest.raises(ConfigError, match="cuda_graphs: needs a CUDA device"):
        load(cuda_graphs=True)
    with pytest.raises(ConfigError, match="largest, 2, is below max_batch_size 4"):
        load(static_buckets=True, batch_buckets=[1, 2])


def test_fp32_and_tf32_claims_exclude_each_other_until_released() -> None:
    # The switches are plain flags, settable without a GPU; the claim logic is what is tested.
    cuda = torch.device("cuda:0")
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        with fp32_mode("fp32", cuda), fp32_mode("fp32", cuda):
            assert torch.backends.cuda.matmul.fp32_precision == "ieee"
            # Both APIs agree: inductor's autotuning reads the old one, which raised on a mix.
            assert torch.get_float32_matmul_precision() == "highest"
            with pytest.raises(ConfigError, match="process-wide"), fp32_mode("tf32", cuda):
                pass
            with fp32_mode("bf16", cuda):  # not an FP32 mode: no claim, no conflict
                pass
        with fp32_mode("tf32", cuda):
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
            assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_bad_batches_are_refused_with_the_reason(tmp_path: Path) -> None:
    path = _mlp_spec(tmp_path)
    extra = {"static_buckets": True, "batch_buckets": [2, 4]}
    backend = create_backend("torch", path, BackendOptions(max_batch_size=4, extra=extra))
    with pytest.raises(BackendError, match="before load"):
        backend.infer({"input": np.zeros((1, 256), np.float32)})
    backend.load()
    with pytest.raises(InvalidInput, match="takes inputs"):
        backend.infer({"x": np.zeros((1, 256), np.float32)})
    with pytest.raises(InvalidInput, match="takes FP32"):
        backend.infer({"input": np.zeros((1, 256), np.float64)})
    with pytest.raises(InvalidInput, match="above the largest batch bucket 4"):
        backend.infer({"input": np.zeros((5, 256), np.float32)})
    assert backend.infer({"input": np.ones((3, 256), np.float32)})["output"].shape == (3, 10)
    backend.unload()
