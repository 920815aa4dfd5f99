"""int4 weights unpacked to float32 for a prefill chunk (`engine.models.int4_unpack`): exactly the
weights torch's int4 kernel applies, read from its packed layout on AVX-512 (blocks of 64 output
features) and AVX2 (blocks of 32) kernels alike, and a chunk's product in float32."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.models import int4_unpack
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
    monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "on")


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
        "print(int4_unpack.pack_block(), int4_unpack.float32_chunks(dense_chunks()), torch.equal(wt.T, applied(layer)))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["32", "True", "True"]


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
        monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "off")
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
            monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "off")
            kernel = layer(x)
            monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "on")
        assert torch.equal(unpacked_allowed, kernel)
    rows = int4_unpack.MIN_ROWS
    assert not int4_unpack.unpacks(rows, 48, True) and int4_unpack.unpacks(rows, 128, True)  # "on": whatever the CPU


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


def test_an_unknown_setting_is_refused(monkeypatch):
    monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "fast")
    with pytest.raises(ValueError, match="FLOAT32_CHUNKS"):
        int4_unpack.float32_chunks(False)


@known_layout
def test_release_drops_the_buffers(unpacking):
    layer = Int4Linear(linear(64, 128))
    with torch.inference_mode():
        layer(torch.randn(int4_unpack.MIN_ROWS, 64))
    assert int4_unpack._buffers
    int4_unpack.release()
    assert not int4_unpack._buffers


@known_layout
def test_auto_unpacks_only_where_bfloat16_matmuls_are_not_native(monkeypatch):
    monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "auto")
    assert int4_unpack.float32_chunks(False) and not int4_unpack.float32_chunks(True)
    monkeypatch.setattr(int4_unpack, "FLOAT32_CHUNKS", "off")
    assert not int4_unpack.float32_chunks(False)
