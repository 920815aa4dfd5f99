"""The model list: sizes computed from config numbers agree with the model cards and with what the
loader really holds; "fits" is the estimate's arithmetic against the device's memory."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from engine.errors import ModelError
from engine.estimate import KNOWN_SHAPES, peak_cache_bytes
from engine.models.catalog import PROCESS_MARGIN_BYTES, CatalogModel, DeviceMemory, detect_memory, find, fit, load_catalog
from engine.models.decoder import SUPPORTED_MODEL_TYPES
from engine.models.int4_cpu import dense_chunks
from engine.models.loader import load_model
from engine.settings import EngineSettings

# Model cards that state the exact count (the Qwen3 cards round: "0.6B", "1.7B", "4.0B").
EXACT = {"smollm2-135m", "smollm2-360m", "smollm2-1.7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "llama-3.2-1b", "llama-3.2-3b"}


def test_catalog_lists_supported_instruct_models_once():
    models = load_catalog()
    assert len({m.id for m in models}) == len({m.repo for m in models}) == len(models) >= 10
    assert {m.model_type for m in models} == set(SUPPORTED_MODEL_TYPES)
    assert find(models, "QWEN2.5-1.5B").repo == find(models, "Qwen/Qwen2.5-1.5B-Instruct").repo
    with pytest.raises(ModelError, match="pick one of"):
        find(models, "gpt-5")


@pytest.mark.parametrize("model", load_catalog(), ids=lambda m: m.id)
def test_parameters_from_the_config_match_the_model_card(model):
    if model.id in EXACT:
        assert model.parameters == model.published_parameters
    else:
        assert abs(model.parameters / model.published_parameters - 1) < 0.015
    assert model.download_bytes == 2 * model.parameters  # bfloat16 safetensors


def test_kv_bytes_per_token_is_2_L_Hkv_D_2():
    models = {m.id: m for m in load_catalog()}
    assert models["llama-3.2-3b"].kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688
    # the estimate's hand-written shapes agree with the list's config numbers
    for known, listed in (("smollm2-135m", "smollm2-135m"), ("llama-3.2-1b", "llama-3.2-1b"), ("llama-3.2-3b", "llama-3.2-3b"), ("qwen2.5-3b", "qwen2.5-3b"),
                          ("qwen3-4b", "qwen3-4b")):
        assert models[listed].profile == KNOWN_SHAPES[known]


@pytest.fixture(scope="module")
def tokenizer_folder():
    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path

    return converted_folder(default_gguf_path())


def test_the_embedded_model_has_the_listed_smollm2_135m_shape(tokenizer_folder):
    """The list's SmolLM2-135M entry is the embedded model: its converted weights hold exactly the
    parameters computed from the entry (and stated on the model card)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    listed = find(load_catalog(), "smollm2-135m")
    config = AutoConfig.from_pretrained(tokenizer_folder)
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(config, field) == getattr(listed, field), field
    with safe_open(str(tokenizer_folder / "model.safetensors"), framework="pt") as weights:
        held = sum(torch.Size(weights.get_slice(name).get_shape()).numel() for name in weights.keys())
    assert held == listed.parameters == listed.published_parameters == 134_515_008


TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)


@pytest.mark.parametrize("config, extra", [
    (LlamaConfig(**TINY, tie_word_embeddings=True), {}),
    (LlamaConfig(**TINY, tie_word_embeddings=False), {}),
    (Qwen2Config(**TINY, tie_word_embeddings=True), {"attention_bias": True}),
    (Qwen3Config(**TINY, head_dim=64, tie_word_embeddings=True), {"qk_norm": True, "head_dim": 64}),
], ids=["llama-tied", "llama-untied", "qwen2", "qwen3"])
def test_4bit_weight_bytes_are_what_the_loader_holds(tmp_path, config, extra, tokenizer_folder):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, tmp_path / name)
    listed = CatalogModel(id="tiny", repo="t/tiny", name="tiny", model_type=config.model_type,
                          tie_word_embeddings=config.tie_word_embeddings, **TINY, **extra)
    assert listed.parameters == sum(p.numel() for p in model.parameters())
    assert load_model(str(tmp_path), device="cpu", weights="4bit").weight_bytes == listed.weight_4bit_bytes(4)
    int4 = load_model(str(tmp_path), device="cpu", weights="int4")
    assert int4.weight_bytes == listed.weight_int4_bytes(bf16_matmuls=dense_chunks())

def test_fit_adds_weights_kv_peak_and_workspace_and_says_why():
    model = find(load_catalog(), "qwen2.5-1.5b")
    settings = EngineSettings(weights="4bit")
    roomy = fit(model, settings, DeviceMemory("cpu", "RAM", 64 * 1024**3, 4))
    assert roomy.weights_label == "4-bit NF4" and roomy.weights_bytes == model.weight_4bit_bytes(4)
    assert roomy.fits and roomy.reason.startswith("needs ") and "of 64.0 GiB RAM" in roomy.reason
    policy = settings.cache
    assert roomy.kv_bytes > peak_cache_bytes(model.profile, policy, policy.budget_tokens + policy.chunk_tokens)  # + recall
    assert roomy.needed_bytes == roomy.weights_bytes + roomy.kv_bytes + roomy.workspace_bytes
    assert roomy.workspace_bytes > PROCESS_MARGIN_BYTES

    tight = DeviceMemory("cuda", "GPU", roomy.needed_bytes, 4)
    assert fit(model, settings, tight).fits
    bigger = settings.replace(cache=dataclasses.replace(policy, budget_tokens=4 * policy.budget_tokens))
    over = fit(model, bigger, tight)
    assert not over.fits and "more than the" in over.reason
    # on a GPU the embeddings are 16-bit: less memory than on the CPU
    assert fit(model, settings, DeviceMemory("cuda", "GPU", 8 * 1024**3, 2)).weights_bytes < roomy.weights_bytes


def test_fit_counts_the_weights_the_loader_will_hold():
    """On a CPU, "auto" streams a catalog model (safetensors) into int4 whatever its size (the
    loader's own rule), so "fits" counts the int4 size there even where its float32 weights would
    take over a quarter of RAM (they were listed as NF4 until then); a GPU gets NF4."""
    model, auto = find(load_catalog(), "qwen2.5-1.5b"), EngineSettings()
    full = model.parameters * 4
    int4 = model.weight_int4_bytes(bf16_matmuls=False)
    big_ram = fit(model, auto, DeviceMemory("cpu", "RAM", 4 * full, 4))
    assert big_ram.weights_label == "4-bit int4" and big_ram.weights_bytes == int4 < full
    cpu_full = fit(model, auto.replace(weights="full"), DeviceMemory("cpu", "RAM", 4 * full, 4))
    assert cpu_full.weights_label == "float32" and cpu_full.weights_bytes == full
    small_ram = fit(model, auto, DeviceMemory("cpu", "RAM", full, 4))
    assert small_ram.weights_label == "4-bit int4" and small_ram.weights_bytes == int4
    assert small_ram.fits and small_ram.needed_bytes < full
    too_small = fit(model, auto, DeviceMemory("cpu", "RAM", int4, 4))
    assert too_small.weights_label == "4-bit int4" and not too_small.fits
    forced_nf4 = fit(model, auto.replace(weights="4bit"), DeviceMemory("cpu", "RAM", 4 * full, 4))
    assert forced_nf4.weights_label == "4-bit NF4" and forced_nf4.weights_bytes == model.weight_4bit_bytes(4) < full
    gpu = fit(model, auto, DeviceMemory("cuda", "GPU", 100 * full, 2))
    assert gpu.weights_label == "4-bit NF4"
    refused = fit(model, auto.replace(weights="int4"), DeviceMemory("cuda", "GPU", 100 * full, 2))
    assert not refused.fits and "CPU only" in refused.reason
    forced = fit(model, auto.replace(weights="full"), DeviceMemory("cuda", "GPU", 100 * full, 2))
    assert forced.weights_label == "16-bit" and forced.weights_bytes == 2 * model.parameters


def test_int4_sizes_count_the_bfloat16_reading_copy_only_where_the_loader_makes_it():
    """Issue 32: SmolLM2's int4 weights were listed at 407.7 MiB, a bfloat16 reading copy included,
    on a CPU without AVX-512 BF16 that never makes it (205.2 MiB loaded): the list and the loader
    now ask one rule, with the CPU's capability as its argument."""
    from engine.models.weight_format import READING_COPY_MAX_BYTES, keeps_reading_copy

    small = 2 * 135_000_000
    assert keeps_reading_copy("int4", bf16_matmuls=True, bf16_bytes=small)
    assert not keeps_reading_copy("int4", bf16_matmuls=False, bf16_bytes=small)
    assert not any(keeps_reading_copy(held, bf16_matmuls=True, bf16_bytes=small) for held in ("nf4", "full"))
    assert not keeps_reading_copy("int4", bf16_matmuls=True, bf16_bytes=READING_COPY_MAX_BYTES + 1)
    smol, settings = find(load_catalog(), "smollm2-135m"), EngineSettings(weights="int4")
    with_copy = fit(smol, settings, DeviceMemory("cpu", "RAM", 64 * 1024**3, 4, bf16_matmuls=True))
    without = fit(smol, settings, DeviceMemory("cpu", "RAM", 64 * 1024**3, 4, bf16_matmuls=False))
    assert with_copy.weights_bytes == smol.weight_int4_bytes(bf16_matmuls=True)
    assert without.weights_bytes == smol.weight_int4_bytes(bf16_matmuls=False) < with_copy.weights_bytes
    assert any("bfloat16 copy" in what for what, _ in with_copy.weights_parts)
    assert not any("bfloat16 copy" in what for what, _ in without.weights_parts)
    assert "has AVX-512 BF16" in with_copy.weights_note and "has no AVX-512 BF16" in without.weights_note
    # Without AVX-512 BF16 decode steps run the LM head on an int8 copy: a byte per weight plus a
    # bfloat16 scale per output feature (token).
    step = dict(without.weights_parts)["an 8-bit copy of the LM head for answering (decode)"]
    assert step == 49_152 * 576 + 2 * 49_152
    assert not any("8-bit copy" in what for what, _ in with_copy.weights_parts)
    # On this machine the list shows what the loader holds, whichever branch its CPU takes.
    here = detect_memory("cpu")
    assert here.bf16_matmuls == dense_chunks()
    assert load_model("default", device="cpu", weights="int4").weight_bytes == fit(smol, settings, here).weights_bytes


def test_a_model_over_a_gib_at_bfloat16_is_listed_and_loaded_without_the_reading_copy():
    """Issue 40: the 1.5B model's bfloat16 copy (2.6 GB, four times its int4 layers) made its load
    peak at 4.3 GiB on a CPU with AVX-512 BF16; above `READING_COPY_MAX_BYTES` it keeps none (its
    chunks unpack), and the list says so, while the embedded model keeps its copy there."""
    from engine.models.weight_format import READING_COPY_MAX_BYTES

    catalog, settings = load_catalog(), EngineSettings(weights="int4")
    big, smol = find(catalog, "qwen2.5-1.5b"), find(catalog, "smollm2-135m")
    assert 2 * big.parameters > READING_COPY_MAX_BYTES >= 2 * smol.parameters
    memory = DeviceMemory("cpu", "RAM", 64 * 1024**3, 4, bf16_matmuls=True)
    listed = fit(big, settings, memory)
    assert not any("bfloat16 copy" in what for what, _ in listed.weights_parts)
    assert listed.weights_bytes == big.weight_int4_bytes(bf16_matmuls=True) == big.weight_int4_bytes(bf16_matmuls=False) - dict(
        fit(big, settings, DeviceMemory("cpu", "RAM", 64 * 1024**3, 4)).weights_parts)["an 8-bit copy of the LM head for answering (decode)"]
    assert "over 1 GiB at bfloat16" in listed.weights_note
    assert any("bfloat16 copy" in what for what, _ in fit(smol, settings, memory).weights_parts)


def test_the_loader_keeps_no_reading_copy_above_the_limit_and_reads_in_bfloat16_all_the_same(monkeypatch):
    """The loader asks the same rule with the model's own bytes: above the limit (lowered here so the
    embedded model is over it) no `Int4Linear` keeps a copy, the list counts what was loaded, and a
    CPU with AVX-512 BF16 still attends in bfloat16 (the chunks' projections are bfloat16 either way)."""
    from engine.models import int4_cpu, loader, weight_format
    from engine.models.int4_cpu import Int4Linear
    from engine.models.weight_format import keeps_reading_copy

    assert keeps_reading_copy("int4", True, weight_format.READING_COPY_MAX_BYTES)  # at the limit: kept
    monkeypatch.setattr(loader, "dense_chunks", lambda: True)
    monkeypatch.setattr(int4_cpu, "dense_chunks", lambda: True)
    monkeypatch.setattr(weight_format, "READING_COPY_MAX_BYTES", 200_000_000)  # the embedded model: ~270 MB
    lm = load_model("default", device="cpu", weights="int4")
    layers = [m for m in lm.decoder.model.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m.dense is None for m in layers)
    assert lm.decoder.attention_dtype is torch.bfloat16
    smol = find(load_catalog(), "smollm2-135m")
    listed = fit(smol, EngineSettings(weights="int4"), DeviceMemory("cpu", "RAM", 64 * 1024**3, 4, bf16_matmuls=True))
    assert lm.weight_bytes == listed.weights_bytes and "over 1 GiB" in listed.weights_note
    # Its reads are timed apart from the copy's (~1.6x faster): a read is never planned at that rate.
    assert lm.reading_label == "4-bit int4, unpacked to bfloat16" != lm.weights_label
    monkeypatch.setattr(weight_format, "READING_COPY_MAX_BYTES", 1 << 30)
    assert load_model("default", device="cpu", weights="int4").reading_label == "4-bit int4"  # with the copy
    monkeypatch.setattr(loader, "dense_chunks", lambda: False)
    monkeypatch.setattr(int4_cpu, "dense_chunks", lambda: False)
    assert load_model("default", device="cpu", weights="int4").reading_label == "4-bit int4"  # no AVX-512 BF16


def test_the_embedded_model_is_marked_so_nobody_downloads_it_again():
    assert [m.id for m in load_catalog() if m.embedded] == ["smollm2-135m"]
