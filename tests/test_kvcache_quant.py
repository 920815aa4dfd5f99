"""Group quantization: round-trip error within scale / 2, packing, byte counts."""

import pytest
import torch

from engine.kvcache.quant import KVFormat, dequantize, pack_int4, quantize, unpack_int4


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_round_trip_error_within_half_a_step(bits, group_size):
    torch.manual_seed(bits * 100 + group_size)
    # Heavy-tailed values with an outlier channel, like real pre-RoPE keys.
    x = torch.randn(3, 50, 64) * torch.linspace(0.1, 4, 64)
    x[..., 7] *= 25
    codes, scale, zero = quantize(x, bits, group_size)
    back = dequantize(codes, scale, zero, bits, group_size)
    err = (x - back).abs().reshape(3, 50, 64 // group_size, group_size)
    half_step = scale.float()[..., None] / 2
    assert torch.all(err <= half_step * (1 + 1e-5) + 1e-6)
    # and the bound is tight: the worst element uses a good part of it
    assert float((err / half_step).max()) > 0.5
    qmax = (1 << bits) - 1
    group = x.reshape(3, 50, -1, group_size)
    expected_scale = (group.amax(-1) - group.amin(-1)) / qmax
    torch.testing.assert_close(scale.float(), expected_scale, rtol=2e-3, atol=1e-6)


def test_int4_codes_are_packed_two_per_byte():
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)


def test_constant_group_decodes_exactly():
    x = torch.full((2, 64), 3.25)
    codes, scale, zero = quantize(x, 4, 32)
    assert torch.equal(dequantize(codes, scale, zero, 4, 32), x)


@pytest.mark.parametrize("bits,expected", [(4, 32 + 2 * 2 * 2), (8, 64 + 2 * 2 * 2), (16, 128)])
def test_bytes_per_token_matches_encoded_tensors(bits, expected):
    fmt = KVFormat(bits=bits, group_size=32)
    fields = fmt.encode(torch.randn(10, 64))
    assert fmt.bytes_per_token(64) == expected
    assert sum(t.nbytes for t in fields.values()) == 10 * expected


def test_invalid_formats_are_rejected():
    with pytest.raises(ValueError):
        KVFormat(bits=3).validate(64)
    with pytest.raises(ValueError):
        KVFormat(bits=4, group_size=48).validate(64)


def test_a_model_whose_head_size_32_does_not_divide_says_why_and_what_to_set(tmp_path, monkeypatch, capsys):
    """open_llama_3b has 100-channel heads: it failed with "internal error (ValueError: group size 32
    must divide the head dim 100)". A tiny random Llama with 100-channel heads, asked from the CLI."""
    import shutil

    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine.cli import main
    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path

    folder, tokenizer = tmp_path / "llama-hd100", converted_folder(default_gguf_path())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=200, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)
    document = tmp_path / "note.txt"
    document.write_text("The meeting is on Tuesday.\n")
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    argv = ["ask", str(document), "When?", "--model", str(folder), "--device", "cpu", "--max-new-tokens", "2",
            "--no-prefix-cache"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("halaman: this model's attention heads have 100 channels, and the KV cache quantizes them in groups "
                   "of 32, which does not divide 100: set group_size = 20 under [cache] in settings.toml "
                   "(a divisor of the head size), or kv_bits = 16")
    (tmp_path / "home" / "config").mkdir(parents=True, exist_ok=True)
    (tmp_path / "home" / "config" / "settings.toml").write_text("[cache]\ngroup_size = 20\n")
    assert main(argv) == 0  # what the message says to set works
