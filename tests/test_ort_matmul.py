"""bench/ort_matmul.py: int4 projections on ONNX Runtime's MatMulNBits, measured against torch's
int4 kernel in docs/BENCHMARKS.md §5j (and not kept in the engine): the same Q4_1 / Q8_0 weights as
the torch kernel's layers, int8 activations within a bound of them, and no layer moved where the
operator is missing or the packed codes are misread, so the bench's comparisons compare one weight."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from engine.models.int4_cpu import GROUP_SIZE, Int4Linear

BENCH = Path(__file__).resolve().parent.parent / "bench"
_spec = importlib.util.spec_from_file_location("ort_matmul", BENCH / "ort_matmul.py")
om = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(om)

pytestmark = pytest.mark.skipif(not om.available(), reason="onnxruntime without MatMulNBits")


def applied_by_torch_kernel(layer: Int4Linear) -> torch.Tensor:
    """The float32 weight [out, in] torch's int4 kernel applies, read back with a float32 identity
    (the kernel's exact float32 path: each output is one code times its scale plus its zero)."""
    eye = torch.eye(layer.in_features)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.packed, GROUP_SIZE, layer.scales_and_zeros.float()).T


@pytest.mark.parametrize("shape", [(128, 96), (256, 64), (192, 320)])
def test_codes_read_back_from_torchs_layout_dequantize_to_the_weights_the_kernel_applies(shape):
    out_features, in_features = shape
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    torch.nn.init.normal_(linear.weight, generator=torch.Generator().manual_seed(out_features))
    layer = Int4Linear(linear)
    codes, scales, zeros = om.q4_1_parts(linear.weight)  # quantized on their own, in the operator's layout
    unpacked = om.unpack_torch_int4(layer.packed, out_features, in_features)
    assert torch.equal(unpacked[:, 0::2] | (unpacked[:, 1::2] << 4), torch.from_numpy(codes).flatten(1))
    assert torch.allclose(om.dequantized(4, codes, scales, zeros), applied_by_torch_kernel(layer), rtol=0, atol=1e-6)


def test_float_activations_apply_the_q4_1_weights_exactly_and_int8_ones_within_their_rounding():
    """Level 0 (float32 activations) is the dequantized weights' product to float32 rounding, so the
    codes, scales and the added zero term are right; level 4 rounds each block of 32 inputs to int8
    (half a step of max|x| / 127 per input), which bounds its error."""
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(256, 512, generator=g), torch.randn(5, 512, generator=g)
    codes, scales, zeros = om.q4_1_parts(weight)
    w = om.dequantized(4, codes, scales, zeros).double()
    exact = x.double() @ w.T
    level0 = om.OrtProjection(512, 256, 4, codes, scales, zeros, threads=1, accuracy_level=0)(x)
    assert float((level0 - exact).abs().max()) < 1e-4
    level4 = om.OrtProjection(512, 256, 4, codes, scales, zeros, threads=1, accuracy_level=4)(x)
    step = x.double().view(5, -1, GROUP_SIZE).abs().amax(-1) / 127  # [rows, blocks]: one int8 step of the inputs
    bound = 0.5 * step @ w.abs().view(256, -1, GROUP_SIZE).sum(-1).T  # half a step times each block's Σ|w|
    assert bool(((level4 - exact).abs() <= 1.05 * bound + 1e-4).all())
    assert not torch.equal(level4, level0)  # level 4 really quantizes the activations


def test_q8_0_weights_are_exact_with_the_default_zero_point():
    g = torch.Generator().manual_seed(2)
    weight, x = torch.randn(64, 96, generator=g), torch.randn(3, 96, generator=g)
    codes, scales = om.q8_0_parts(weight)
    w = om.dequantized(8, codes, scales, None)
    d = weight.view(64, -1, GROUP_SIZE).abs().amax(-1, keepdim=True) / 127  # each block's Q8_0 step
    # half a step, plus the scale's bfloat16 rounding (2^-8 relative) times up to 127 steps
    assert bool(((w - weight).view(64, -1, GROUP_SIZE).abs() <= (0.5 + 127 / 256) * d).all())
    y = om.OrtProjection(96, 64, 8, codes, scales, None, threads=1, accuracy_level=0)(x)
    assert float((y.double() - x.double() @ w.double().T).abs().max()) < 1e-4


def test_a_models_int4_layers_move_to_onnxruntime_and_stay_close_to_the_torch_kernel():
    g = torch.Generator().manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(1536, 256), torch.nn.Linear(256, 128, bias=False))
    for linear in model:
        linear.weight.data.normal_(generator=g)
    kernel = torch.nn.Sequential(*[Int4Linear(linear) for linear in model])
    moved = torch.nn.Sequential(*[Int4Linear(linear) for linear in model])
    x = torch.randn(2, 7, 1536, generator=g)
    with torch.inference_mode():
        expected = kernel(x)
        assert om.int4_layers_on_ort(moved, threads=1) == 2
        y = moved(x)
    assert y.shape == (2, 7, 128) and y.dtype == torch.float32
    # one weight; they differ by the activations' rounding (bfloat16 there, int8 here)
    assert float((y - expected).abs().max()) < 0.03 * float(expected.abs().max())
    assert not torch.equal(y, expected)


def test_without_the_operator_no_layer_moves(monkeypatch):
    """onnxruntime missing (or its build without the contrib op): `available()` says so and the
    model keeps the torch kernel's output bit for bit."""
    model = torch.nn.Sequential(Int4Linear(torch.nn.Linear(64, 128)))
    x = torch.randn(2, 64)
    with torch.inference_mode():
        expected = model(x)
        monkeypatch.setattr(om, "_AVAILABLE", None)
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
        assert not om.available() and om.int4_layers_on_ort(model, threads=1) == 0
        assert torch.equal(model(x), expected)


def test_a_layout_the_reading_does_not_know_falls_back(monkeypatch):
    """A wrong reading of torch's packed codes (here: every code's bits flipped) fails the probe row and keeps
    the torch kernel instead of answering with scrambled weights."""
    layer = Int4Linear(torch.nn.Linear(64, 128))
    assert om.from_torch_int4(layer.packed, layer.scales_and_zeros, 64, 128, 1) is not None
    reading = om.unpack_torch_int4
    monkeypatch.setattr(om, "unpack_torch_int4", lambda p, o, i: reading(p, o, i) ^ 0x0F)  # every code misread
    assert om.from_torch_int4(layer.packed, layer.scales_and_zeros, 64, 128, 1) is None
