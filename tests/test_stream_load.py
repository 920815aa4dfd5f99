"""int4 weights streamed from the safetensors (engine.models.stream_load): the same model as
from_pretrained + quantize_for_cpu, bit for bit, in a fraction of the memory."""

import json
import subprocess
import sys

import pytest
import torch
from test_models import CONFIGS, tiny_model_folder
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

import engine.models.int4_cpu as int4_cpu
from engine.errors import ModelError
from engine.models.gguf_convert import converted_folder
from engine.models.int4_cpu import Int4Linear, Int8Linear, quantize_for_cpu
from engine.models.loader import load_model
from engine.models.source import default_gguf_path
from engine.models.stream_load import load_int4, plan_stream


@pytest.fixture(scope="module")
def tokenizer_folder():
    return converted_folder(default_gguf_path())


def tensors(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter and buffer by name, tied ones under each of their names."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


def assert_same_model(streamed: torch.nn.Module, reference: torch.nn.Module) -> None:
    ours, theirs = tensors(streamed), tensors(reference)
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        other = ours[name]
        assert (tensor is None) == (other is None), name
        if tensor is not None:
            assert other.dtype == tensor.dtype and torch.equal(other, tensor), name
            assert other.device.type == "cpu" and not other.is_meta, name
    assert streamed.generation_config.to_dict() == reference.generation_config.to_dict()
    assert streamed.config._attn_implementation == reference.config._attn_implementation
    ids = torch.arange(1000, 1090)[None]
    with torch.no_grad():
        assert torch.equal(streamed(ids).logits, reference(ids).logits)


def reference_int4(folder, dense: bool, step_copy: bool) -> tuple[torch.nn.Module, int]:
    """The model as the loader built it before streaming (float32 from_pretrained, then quantized in
    place) and its parameters outside the embeddings, counted before quantizing."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    parameters = model.num_parameters(exclude_embeddings=True)
    quantize_for_cpu(model, dense=dense, step_copy=step_copy)
    return model, parameters


@pytest.mark.parametrize("dense, step_copy", [(False, True), (True, False)])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_streamed_int4_is_the_quantized_float_model_bit_for_bit(tmp_path, tokenizer_folder, family, dense, step_copy):
    folder = tiny_model_folder(tmp_path, family, tokenizer_folder)
    plan = plan_stream(folder, AutoConfig.from_pretrained(folder))
    assert plan is not None, "would fall back to loading the whole model"
    model, parameters = load_int4(plan, dense=dense, step_copy=step_copy)
    reference, reference_parameters = reference_int4(folder, dense, step_copy)
    assert parameters == reference_parameters
    assert_same_model(model, reference)


def test_the_embedded_model_loads_as_int4_without_from_pretrained(tokenizer_folder, monkeypatch):
    """The app's default: a tied LM head (its own 8-bit copy of the float32 embedding), streamed
    through load_model, never through from_pretrained, and the model it always was."""
    reference, parameters = reference_int4(tokenizer_folder, dense=False, step_copy=True)
    import engine.models.loader as loader

    monkeypatch.setattr(loader, "dense_chunks", lambda: False)

    def refuse(*_args, **_kwargs):
        raise AssertionError("from_pretrained holds the float32 model")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    loaded = load_model("default", device="cpu", weights="int4")
    assert isinstance(loaded.decoder.lm_head, Int8Linear) and loaded.decoder.lm_head.step_codes is not None
    assert loaded.parameters == parameters > 0
    assert_same_model(loaded.decoder.model, reference)


def test_a_folder_without_safetensors_falls_back_to_the_whole_load(tmp_path, tokenizer_folder):
    folder = tiny_model_folder(tmp_path, "llama", tokenizer_folder)
    (folder / "model.safetensors").unlink()  # as a folder holding only another format
    assert plan_stream(folder, AutoConfig.from_pretrained(folder)) is None


def strip_model_prefix(folder):
    """Rewrite `folder`'s safetensors with the base model's names ("layers.0…", not
    "model.layers.0…"), as a checkpoint of the bare model stores them: from_pretrained adds the
    prefix back, `load_int4` does not look names up that way."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def test_plan_stream_says_which_folders_load_int4_reads_and_never_raises(tmp_path, tokenizer_folder):
    plain = tiny_model_folder(tmp_path / "plain", "qwen2", tokenizer_folder)
    config = AutoConfig.from_pretrained(plain)
    assert plan_stream(plain, config) is not None
    renamed = tiny_model_folder(tmp_path / "renamed", "qwen2", tokenizer_folder)
    strip_model_prefix(renamed)
    assert plan_stream(renamed, AutoConfig.from_pretrained(renamed)) is None
    quantized = tiny_model_folder(tmp_path / "quantized", "qwen2", tokenizer_folder)
    raw = json.loads((quantized / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**raw, "quantization_config": {"quant_method": "bitsandbytes"}}))
    assert plan_stream(quantized, AutoConfig.from_pretrained(quantized)) is None
    assert plan_stream(tmp_path / "nowhere", config) is None


def test_a_folder_whose_plan_fails_is_not_loaded_whole_behind_the_users_back(tmp_path, tokenizer_folder, monkeypatch):
    """Planning the stream can fail past the headers `full_weight_bytes` checks (reading a stored
    head, building the model): an int4 load then says why, as streaming did, instead of loading
    the whole float32 model, the memory streaming exists to spare."""
    import engine.models.loader as loader

    folder = tiny_model_folder(tmp_path, "llama", tokenizer_folder)

    def fail(*_args):
        raise OSError("simulated read error")

    def refuse(*_args, **_kwargs):
        raise AssertionError("from_pretrained holds the float32 model")

    monkeypatch.setattr(loader, "plan_stream", fail)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    for weights in ("int4", "auto"):  # a model this small gets int4 from "auto" even when it does not stream
        with pytest.raises(ModelError, match=f"could not load the model in {folder.name}: OSError: simulated read error"):
            load_model(str(folder), device="cpu", weights=weights)


def test_a_tied_head_stored_beside_its_embedding_counts_once_and_still_streams(tmp_path, tokenizer_folder, monkeypatch):
    """Qwen3-0.6B's checkpoint stores `lm_head.weight`, a copy of the embedding its config ties it
    to (a 1.5 GB file for 0.6B parameters): the loader's count, which decides the reading copy, must
    be the model's one tensor, and the model the one from_pretrained ties. An "auto" load plans the
    stream once: one model built without weights, one comparison of the two stored matrices."""
    from safetensors.torch import load_file, save_file

    import engine.models.loader as loader
    import engine.models.stream_load as stream_load
    from engine.models.loader import full_weight_bytes

    folder = tiny_model_folder(tmp_path / "head", "qwen3", tokenizer_folder)  # untied: the file stores the head
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    untied = full_weight_bytes(folder, torch.float32, AutoConfig.from_pretrained(folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tied = AutoConfig.from_pretrained(folder)
    assert full_weight_bytes(folder, torch.float32, tied) == untied - tensors["lm_head.weight"].numel() * 4
    plan = plan_stream(folder, tied)
    assert plan is not None
    assert full_weight_bytes(folder, torch.float32, tied, plan) == untied - tensors["lm_head.weight"].numel() * 4
    model, _ = load_int4(plan, dense=False, step_copy=False)
    assert_same_model(model, reference_int4(folder, False, False)[0])

    calls = {"plans": 0, "comparisons": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(loader, "plan_stream", counted("plans", stream_load.plan_stream))
    monkeypatch.setattr(stream_load, "_same_stored", counted("comparisons", stream_load._same_stored))
    loaded = load_model(str(folder), device="cpu", weights="auto")
    assert loaded.weights == "int4" and calls == {"plans": 1, "comparisons": 1}


def test_a_tied_config_with_a_different_stored_head_loads_both_as_from_pretrained_does(tmp_path, tokenizer_folder):
    """transformers 5 keeps a stored LM head apart from the embedding when their values differ, even
    under a tied config: such a folder does not stream (streaming ties them), counts both matrices,
    and loads as the whole load + quantizing gives it."""
    from safetensors.torch import load_file

    from engine.models.loader import full_weight_bytes

    folder = tiny_model_folder(tmp_path / "apart", "llama", tokenizer_folder)
    tensors = load_file(folder / "model.safetensors")
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    untied = full_weight_bytes(folder, torch.float32, AutoConfig.from_pretrained(folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tied = AutoConfig.from_pretrained(folder)
    assert full_weight_bytes(folder, torch.float32, tied) == untied
    assert plan_stream(folder, tied) is None
    loaded = load_model(str(folder), device="cpu", weights="auto")
    assert loaded.weights == "int4"
    dense = any(m.dense is not None for m in loaded.decoder.model.modules() if isinstance(m, Int4Linear))
    assert_same_model(loaded.decoder.model, reference_int4(folder, dense, loaded.decoder.int8_steps)[0])


def test_a_folder_asking_to_run_its_own_code_is_refused_without_running_it(tmp_path, tokenizer_folder):
    """A config naming an unknown model type with an `auto_map` to a Python file in the folder: the
    load says which types Halaman runs, and never imports that file (nor asks to)."""
    folder = tiny_model_folder(tmp_path / "custom", "llama", tokenizer_folder)
    marker = tmp_path / "ran.txt"
    (folder / "custom_config.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n\n\nclass CustomConfig(PretrainedConfig):\n    model_type = 'custommodel'\n")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "custommodel",
                                                   "auto_map": {"AutoConfig": "custom_config.CustomConfig"}}))
    with pytest.raises(ModelError, match="'custommodel' model; Halaman runs llama, qwen2, qwen3"):
        load_model(str(folder), device="cpu", weights="auto")
    assert not marker.exists()


def test_auto_weights_on_a_cpu_stream_a_model_into_int4_even_in_little_ram(tmp_path, tokenizer_folder, monkeypatch):
    """"auto" once gave NF4 to every model whose float32 weights took over a quarter of RAM (a 1.7B
    model on a 16 GB laptop), a rule from the loader that held them; one that streams now loads as
    int4, and only a folder loaded whole keeps the old rule."""
    import psutil

    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(total=1 << 20))  # 1 MiB of "RAM"
    folder = tiny_model_folder(tmp_path / "plain", "llama", tokenizer_folder)
    assert load_model(str(folder), device="cpu", weights="auto").weights == "int4"
    renamed = tiny_model_folder(tmp_path / "renamed", "llama", tokenizer_folder)
    strip_model_prefix(renamed)
    assert load_model(str(renamed), device="cpu", weights="auto").weights == "nf4"
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real)
    whole = load_model(str(renamed), device="cpu", weights="auto")  # 24 GiB: loaded whole, then int4
    assert whole.weights == "int4" and isinstance(whole.decoder.layers[0].self_attn.q_proj, Int4Linear)


@pytest.mark.parametrize("layer, option", [(Int4Linear, "dense"), (Int8Linear, "step_copy")])
def test_quantizing_in_row_blocks_is_the_one_pass_result(monkeypatch, layer, option):
    """A layer quantized 64 output features at a time holds what one pass over the whole matrix holds."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 400)
    whole = layer(linear, **{option: True})
    monkeypatch.setattr(int4_cpu, "ROWS_PER_PASS", 64)
    blocks = layer(linear, **{option: True})
    for name, tensor in whole.named_buffers():
        assert torch.equal(dict(blocks.named_buffers())[name], tensor), name
    x = torch.randn(3, 96)
    assert torch.equal(blocks(x), whole(x))


# A model whose float32 decoder weights (24 layers, 290 MB) dwarf one layer's (12 MB) and the int4
# result (~50 MB): streaming rose the peak RSS by ~70 MB, from_pretrained + quantize_for_cpu by ~420 MB.
MEMORY_CONFIG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=24,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)

PEAK_CHILD = """
import json, sys
from pathlib import Path
import accelerate, safetensors, torch  # noqa: F401 - imported before the peak is reset, as the load's own imports
from transformers import AutoConfig, AutoModelForCausalLM
from engine.models.int4_cpu import quantize_for_cpu
from engine.models.stream_load import load_int4, plan_stream

def status(field):  # kB in /proc/self/status
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024

folder = Path(sys.argv[1])
config = AutoConfig.from_pretrained(folder)
with torch.device("meta"):  # the model's code imported and run once: its cost is not the load's
    AutoModelForCausalLM.from_config(config)
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # the peak (VmHWM) starts again from the RSS now (Linux 4.0+)
base = status("VmRSS")
if sys.argv[2] == "stream":
    model, _ = load_int4(plan_stream(folder, config), dense=False, step_copy=True)
else:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    quantize_for_cpu(model, dense=False, step_copy=True)
print(json.dumps({"rise": status("VmHWM") - base}))
"""


def peak_rise(folder, how: str) -> int:
    """Bytes the process's peak RSS rose by while loading `folder` as int4 `how` ("stream" or
    "whole"), in a fresh process whose imports are done before the peak is reset."""
    done = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(folder), how], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["rise"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resets the peak RSS through /proc (Linux)")
def test_loading_holds_one_layer_of_float32_weights_not_the_model(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen2Config(**MEMORY_CONFIG), dtype=torch.bfloat16).save_pretrained(tmp_path)
    with torch.device("meta"):
        layers = AutoModelForCausalLM.from_config(Qwen2Config(**MEMORY_CONFIG)).model.layers
    model_float32 = 4 * sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))
    streamed = peak_rise(tmp_path, "stream")
    whole = peak_rise(tmp_path, "whole")
    assert whole > model_float32  # the measurement sees a load that holds the float32 model
    assert streamed < model_float32 / 2, f"streaming rose the peak RSS by {streamed / 2**20:.0f} MiB"
