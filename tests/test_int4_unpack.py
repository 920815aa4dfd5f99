"""int4 weights unpacked for a prefill chunk (`engine.models.int4_unpack`): exactly the weights torch's
int4 kernel applies, read from its packed layout on AVX-512 (blocks of 64 output features) and AVX2
(blocks of 32) kernels alike; in bfloat16 exactly the reading copy; a chunk's product tile by tile."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.models import int4_unpack
from engine.models import int4_cpu
from engine.models.int4_cpu import Int4Linear, Int8Linear, quantize_for_cpu


def linear(in_features, out_features, seed=0):
    layer = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.02)
    return layer


def applied(layer):
    """The weights `[out, in]` float32 an `Int4Linear` of `layer` applies, computed here from its float32
    weights: Q4_1's min/max codes, scale and zero rounded to bfloat16 as the kernel holds them."""
    out_features, in_features = layer.weight.shape
    w = layer.weight.detach().view(out_features, in_features // 32, 32)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny)
    codes = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15)
    zero = low + 8 * scale
    held = lambda t: t.to(torch.bfloat16).float()[..., None]  # noqa: E731
    return ((codes - 8) * held(scale) + held(zero)).flatten(1)


known_layout = pytest.mark.skipif(int4_unpack.pack_block() is None, reason="torch's int4 packing here is not a known layout")


@pytest.fixture
def unpacking(monkeypatch):
    """Chunks unpack to float32, as on a CPU without AVX-512 BF16, whatever this one has."""
    monkeypatch.setattr(int4_unpack, "UNPACKED_CHUNKS", True)
    monkeypatch.setattr(int4_cpu, "dense_chunks", lambda: False)


@known_layout
@pytest.mark.parametrize(("in_features", "out_features"), [(96, 192), (576, 960), (1536, 256)])
def test_the_unpacked_weights_are_the_ones_the_kernel_applies(in_features, out_features):
    layer = linear(in_features, out_features)
    packed = Int4Linear(layer)
    wt = int4_unpack.weight_t(packed.packed, packed.scales_and_zeros, in_features, out_features)
    assert wt.shape == (in_features, out_features) and wt.dtype == torch.float32
    assert torch.equal(wt.T, applied(layer))


@known_layout
def test_a_cpu_held_to_avx2_packs_in_blocks_of_32_and_unpacks_them():
    """The AVX2 kernels pack another layout; run as such a CPU (as on a laptop without AVX-512), the
    unpacked weights are again exactly the applied ones, and chunks take this path by default."""
    code = (
        "import torch, sys; sys.path.insert(0, 'tests'); from test_int4_unpack import linear, applied\n"
        "from engine.models import int4_unpack; from engine.models.int4_cpu import Int4Linear\n"
        "layer = linear(576, 960); p = Int4Linear(layer)\n"
        "wt = int4_unpack.weight_t(p.packed, p.scales_and_zeros, 576, 960)\n"
        "from engine.models.int4_cpu import dense_chunks\n"
        "print(int4_unpack.pack_block(), int4_unpack.unpacks(int4_unpack.MIN_ROWS, 960), dense_chunks(), torch.equal(wt.T, applied(layer)))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["32", "True", "False", "True"]  # unpacked to float32 there


@known_layout
def test_a_long_chunk_runs_in_float32_on_the_unpacked_weights_and_a_short_one_on_the_kernel(unpacking, monkeypatch):
    layer = linear(576, 960)
    packed = Int4Linear(layer)
    weights = applied(layer).double()
    x = torch.randn(int4_unpack.MIN_ROWS, 576, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        chunk = packed(x)
        step = packed(x[:1])
        short = packed(x[: int4_unpack.MIN_ROWS - 1])  # a question's chunk, a draft's check: the kernel
        monkeypatch.setattr(int4_unpack, "UNPACKED_CHUNKS", False)
        kernel = packed(x)
    reference = x.double() @ weights.T
    error = lambda y: float((y.double() - reference[: y.shape[0]]).norm() / reference[: y.shape[0]].norm())  # noqa: E731
    assert chunk.dtype == torch.float32 and error(chunk) < 1e-6  # float32 activations and weights
    assert 1e-4 < error(kernel) < 1e-2  # the kernel rounds the activations to bfloat16
    assert 1e-4 < error(step) < 1e-2 and torch.equal(step, kernel[:1])  # a step keeps the kernel
    assert 1e-4 < error(short) < 1e-2


@known_layout
def test_the_lm_head_and_partial_blocks_keep_the_kernel(unpacking, monkeypatch):
    """An `Int8Linear`'s two planes take the input twice, and a layer whose output features do not
    fill whole packing blocks is packed in a layout not read here: both keep the kernel."""
    x = torch.randn(int4_unpack.MIN_ROWS, 64, generator=torch.Generator().manual_seed(2))
    for layer in (Int8Linear(linear(64, 128)), Int4Linear(linear(64, 48))):
        with torch.inference_mode():
            unpacked_allowed = layer(x)
            monkeypatch.setattr(int4_unpack, "UNPACKED_CHUNKS", False)
            kernel = layer(x)
            monkeypatch.setattr(int4_unpack, "UNPACKED_CHUNKS", True)
        assert torch.equal(unpacked_allowed, kernel)
    rows = int4_unpack.MIN_ROWS
    assert not int4_unpack.unpacks(rows, 48) and int4_unpack.unpacks(rows, 128) and not int4_unpack.unpacks(rows - 1, 128)


@known_layout
def test_a_model_reads_a_chunk_with_the_same_outputs_unpacked_as_float32_weights_give(unpacking):
    """A whole quantized model: a chunk through the unpacked layers equals the same model with each
    `Int4Linear` replaced by a float32 `nn.Linear` of its applied weights."""
    model = torch.nn.Sequential(linear(64, 256, 3), torch.nn.SiLU(), linear(256, 64, 4))
    reference = torch.nn.Sequential(*[torch.nn.Linear(m.in_features, m.out_features, bias=False) if isinstance(m, torch.nn.Linear)
                                      else m for m in model])
    for ours, theirs in zip(model, reference, strict=True):
        if isinstance(ours, torch.nn.Linear):
            with torch.no_grad():
                theirs.weight.copy_(applied(ours))
    quantize_for_cpu(model, dense=False, step_copy=False)
    assert all(isinstance(m, Int4Linear) for m in (model[0], model[2]))
    x = torch.randn(int4_unpack.MIN_ROWS, 64, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-6)


@known_layout
def test_release_drops_the_buffers(unpacking):
    layer = Int4Linear(linear(64, 128))
    with torch.inference_mode():
        layer(torch.randn(int4_unpack.MIN_ROWS, 64))
    assert int4_unpack._buffers
    int4_unpack.release()
    assert not int4_unpack._buffers


@known_layout
@pytest.mark.parametrize(("in_features", "out_features"), [(96, 192), (576, 960), (1536, 256)])
def test_unpacked_to_bfloat16_they_are_the_reading_copy(in_features, out_features):
    """Rounded once from the float32 weights as stored: bit for bit the copy a small model keeps."""
    layer = Int4Linear(linear(in_features, out_features), dense=True)
    wt = int4_unpack.weight_t(layer.packed, layer.scales_and_zeros, in_features, out_features, torch.bfloat16)
    assert wt.dtype == torch.bfloat16 and torch.equal(wt.T, layer.dense)


@known_layout
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_product_in_several_tiles_equals_one_over_the_whole_layer(monkeypatch, dtype):
    """Tiles of whole blocks, a last one shorter: the same weights, each output column computed
    from the same row of the same weights (compared against float64 on the same unpacked weights)."""
    in_features, out_features = 256, 7 * int4_unpack.pack_block()
    layer = Int4Linear(linear(in_features, out_features, seed=7))
    x = torch.randn(int4_unpack.MIN_ROWS, in_features, generator=torch.Generator().manual_seed(8)).to(dtype)
    whole = int4_unpack.weight_t(layer.packed, layer.scales_and_zeros, in_features, out_features, dtype).clone()
    monkeypatch.setattr(int4_unpack, "TILE_WEIGHTS", 2 * in_features * int4_unpack.pack_block())  # 4 tiles: 2, 2, 2, 1 blocks
    with torch.inference_mode():
        tiled = int4_unpack.product(x, layer.packed, layer.scales_and_zeros, in_features, out_features)
    reference = x.double() @ whole.double()
    assert tiled.dtype == dtype and tiled.shape == (x.shape[0], out_features)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16 outputs: 8 bits of mantissa
    assert float((tiled.double() - reference).norm() / reference.norm()) < tolerance
    assert torch.equal(tiled[:, -int4_unpack.pack_block():], torch.mm(x, whole[:, -int4_unpack.pack_block():]))


@known_layout
def test_a_chunk_on_a_cpu_with_bfloat16_matmuls_unpacks_to_bfloat16_and_matches_the_copy(monkeypatch):
    """A layer without a reading copy on a CPU with AVX-512 BF16: a long chunk unpacks to bfloat16
    (the copy's weights) and gives the copy's outputs to bfloat16's rounding; a short one keeps the kernel."""
    monkeypatch.setattr(int4_cpu, "dense_chunks", lambda: True)
    with_copy = Int4Linear(linear(576, 960, seed=9), dense=True)
    without = Int4Linear(linear(576, 960, seed=9), dense=False)
    x = torch.randn(int4_unpack.MIN_ROWS, 576, generator=torch.Generator().manual_seed(10))
    calls = []
    product = int4_unpack.product
    monkeypatch.setattr(int4_unpack, "product", lambda x, *rest: calls.append(x.dtype) or product(x, *rest))
    with torch.inference_mode():
        unpacked, copy = without(x), with_copy(x)
        short = without(x[:-1])
        monkeypatch.setattr(int4_unpack, "UNPACKED_CHUNKS", False)
        kernel_short, kernel = without(x[:-1]), without(x)
    assert calls == [torch.bfloat16]  # the long chunk only, unpacked to bfloat16
    assert unpacked.dtype == copy.dtype == torch.float32  # each returns in the input's dtype
    # the same bfloat16 weights summed in another order: far closer to the copy than the kernel is
    assert float((unpacked - copy).norm() / copy.norm()) < 1e-4 < float((kernel - copy).norm() / copy.norm())
    assert torch.equal(short, kernel_short)
