"""CPU low-bit weights (`engine.models.int4_cpu`): exact on GGUF's Q4_1 / Q8_0 grids, and the embedded
model's int4 logits close to float32's on real text (docs/BENCHMARKS.md §3)."""

import os
import subprocess
import sys

import pytest
import torch

from engine.models.int4_cpu import GROUP_SIZE, KERNEL_ROWS, Int4Linear, Int8Linear, dense_chunks


def linear_with(weight: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data.copy_(weight)
    return linear


def as_matrix(layer: torch.nn.Module, in_features: int) -> torch.Tensor:
    """The weight a layer really applies, read back through the kernel with the identity."""
    with torch.inference_mode():
        return layer(torch.eye(in_features)).T


def test_int4_gets_the_codes_of_a_q4_1_grid_back_exactly():
    """A weight on Q4_1's grid (w = q · d + m per 32 inputs) whose d and m bfloat16 holds exactly is
    applied bit for bit: the min/max quantization finds every code again."""
    g = torch.Generator().manual_seed(0)
    out, groups = 96, 6
    d = 2.0 ** -torch.randint(4, 8, (out, groups, 1), generator=g)
    m = torch.randint(-40, 0, (out, groups, 1), generator=g) * d
    q = torch.randint(0, 16, (out, groups, GROUP_SIZE), generator=g)
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 spans each block from its min to its max
    weight = (q * d + m).view(out, groups * GROUP_SIZE)
    assert torch.equal(as_matrix(Int4Linear(linear_with(weight)), groups * GROUP_SIZE), weight)


def test_int8_gets_the_codes_of_a_q8_0_grid_back_exactly():
    """Likewise for Q8_0 (w = q · d, q in -127..127), held as two 4-bit planes."""
    g = torch.Generator().manual_seed(1)
    out, groups = 64, 4
    d = 2.0 ** -torch.randint(6, 10, (out, groups, 1), generator=g)
    q = torch.randint(-127, 128, (out, groups, GROUP_SIZE), generator=g)
    q[..., 0] = 127 * torch.where(torch.rand(out, groups, generator=g) < 0.5, -1, 1)  # the block's max |q|
    weight = (q * d).view(out, groups * GROUP_SIZE)
    assert torch.equal(as_matrix(Int8Linear(linear_with(weight)), groups * GROUP_SIZE), weight)


def test_chunks_through_the_bfloat16_copy_apply_the_same_weights_as_the_kernel():
    """Prefill chunks (more than KERNEL_ROWS rows) take the dense copy, decode steps the kernel:
    both must apply one weight, or a document read and its answer would see different models."""
    g = torch.Generator().manual_seed(3)
    linear = linear_with(torch.randn(64, 96, generator=g))
    layer = Int4Linear(linear, dense=True)
    x = torch.randn(1, 4 * KERNEL_ROWS, 96, generator=g)
    with torch.inference_mode():
        chunk = layer(x)
        rows = torch.cat([layer(x[:, i : i + 1]) for i in range(x.shape[1])], 1)
    assert layer.dense is not None
    # both round their output to bfloat16 after summing in their own order: a few units in its last place
    assert float((chunk - rows).abs().max()) < 0.01 * float(rows.abs().max())
    assert torch.equal(as_matrix(layer, 96), as_matrix(Int4Linear(linear), 96))  # the identity reads the weights back


def test_off_grid_weights_are_rounded_to_the_nearest_step_and_biases_kept():
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(2))
    linear = linear_with(weight)
    linear.bias = torch.nn.Parameter(torch.arange(48.0))
    layer = Int4Linear(linear)
    with torch.inference_mode():
        applied = layer(torch.eye(64)) - linear.bias
    step = (weight.view(48, 2, 32).amax(-1) - weight.view(48, 2, 32).amin(-1)) / 15
    error = (applied.T - weight).abs().view(48, 2, 32).amax(-1)
    assert bool((error <= 0.51 * step + 0.02).all())  # half a step, plus bfloat16's rounding
    for shape in ((48, 16), (64, 8)):  # inputs not in 32s, outputs not in 16s
        with pytest.raises(ValueError, match="multiples of"):
            Int4Linear(torch.nn.Linear(*shape))


def test_the_embedded_model_in_int4_agrees_with_float32_on_real_text(smol, corpus):
    """The CPU's default weights: measured on 4,092 tokens of P05 (bench/weights_quality.py), top-1
    agreement 97.9 % (98.1 % through the kernel alone), KL 0.0008 nats, perplexity +0.01 %; NF4 (a
    GPU's weights) agreed on 74 %. A broken code, scale or zero point, or the head quantized per
    tensor (torch's dynamic int8 linear), falls far below these bounds."""
    from engine.documents import load_document
    from engine.models.catalog import load_catalog
    from engine.models.loader import load_model

    int4, full = load_model("default", device="cpu"), smol
    assert int4.weights == "int4" and int4.weights_label == "4-bit int4" and full.weights == "float32"
    decoder = int4.decoder
    assert isinstance(decoder.lm_head, Int8Linear) and isinstance(decoder.layers[0].mlp.down_proj, Int4Linear)
    assert decoder.embed.weight.dtype == torch.float32  # the lookup stays float32
    assert int4.weight_bytes == next(m for m in load_catalog() if m.embedded).weight_int4_bytes(bf16_matmuls=dense_chunks())
    assert int4.weight_bytes < 0.85 * full.weight_bytes

    text = load_document(corpus / "pdf" / "P05_dmca.pdf").render()
    ids = torch.tensor(int4.tokenizer(text, add_special_tokens=False)["input_ids"][:512])
    with torch.inference_mode():
        ref = full.decoder.model(ids[None]).logits[0].float().log_softmax(-1)
        ours = decoder.model(ids[None]).logits[0].float().log_softmax(-1)
    agree = float((ref.argmax(-1) == ours.argmax(-1)).float().mean())
    kl = float((ref.exp() * (ref - ours)).sum(-1).mean())
    nll = lambda logp: float(-logp[:-1].gather(1, ids[1:, None]).mean())  # noqa: E731
    assert agree >= 0.95 and kl < 0.005
    assert nll(ours) < nll(ref) + 0.01  # perplexity within 1 %


@pytest.mark.parametrize("dense", [False, True])
def test_fused_layers_give_each_parts_output_bit_for_bit(dense):
    """q|k|v fused into one int4 layer (`fuse`, one kernel call per decode step): its output is the
    parts' outputs side by side, exactly, for a decode step's rows and a chunk's; the parts still
    give their own outputs afterwards (their codes are now views of the fused ones), biases kept."""
    from engine.models.int4_cpu import fuse

    torch.manual_seed(4)
    linears = [torch.nn.Linear(128, out, bias=bias) for out, bias in ((128, True), (64, False), (32, True))]
    parts = [Int4Linear(linear, dense=dense) for linear in linears]
    inputs = [torch.randn(1, 128), torch.randn(3, 7, 128), torch.randn(KERNEL_ROWS + 9, 128)]
    with torch.inference_mode():
        before = [[part(x) for part in parts] for x in inputs]
        fused = fuse(parts)
        for x, expected in zip(inputs, before, strict=True):
            assert torch.equal(fused(x), torch.cat(expected, dim=-1))
            assert all(torch.equal(part(x), y) for part, y in zip(parts, expected, strict=True))
    assert parts[1].packed.data_ptr() == fused.packed[128:].data_ptr()  # a view, not a second copy
    with pytest.raises(ValueError):  # other input features
        fuse([parts[0], Int4Linear(torch.nn.Linear(64, 32))])
    with pytest.raises(ValueError):  # a part before the last not in whole packing blocks: the kernel would misread it
        fuse([Int4Linear(torch.nn.Linear(128, 96)), Int4Linear(torch.nn.Linear(128, 32))])


def test_the_lm_heads_step_copy_applies_its_weights_within_half_an_int8_step():
    """Decode steps (at most KERNEL_ROWS rows) run the LM head on its int8 step copy, a prefill's
    rows on the two 4-bit planes: the copy holds the weights the planes apply, each within half its
    row's int8 step, so a read and its answer see one head but for that rounding (module docstring)."""
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(48, 64, generator=g)
    plain, step = Int8Linear(linear_with(weight)), Int8Linear(linear_with(weight), step_copy=True)
    assert step.step_codes is not None and step.step_codes.dtype == torch.int8 and plain.step_codes is None
    applied = as_matrix(plain, 64)  # the planes' weights, read back through the int4 kernel (64 rows)
    with torch.inference_mode():
        rows = torch.cat([step(torch.eye(64)[i : i + 1]) for i in range(64)]).T
        assert torch.equal(step(torch.eye(64)).T, applied)  # more than KERNEL_ROWS rows: the planes
    largest = applied.abs().amax(1, keepdim=True)
    # half an int8 step of the row, plus the kernel's bfloat16 output rounding (3 significant digits)
    assert bool(((rows - applied).abs() <= largest / 254 + 0.004 * largest).all())
    assert not torch.equal(rows, applied)  # a step really runs the copy
    assert Int4Linear(linear_with(weight)).step_codes is None  # the int4 layers keep their kernel


def test_torch_held_to_avx2_reads_without_the_bfloat16_copy():
    """`ATEN_CPU_CAPABILITY=avx2` (the way an AVX-512 machine is run as an AVX2-only laptop CPU) turns
    the bfloat16 reading copy off, as on such a CPU, whatever the hardware reports."""
    code = "from engine.models.int4_cpu import dense_chunks; print(dense_chunks())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
