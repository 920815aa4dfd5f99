"""bench/shape_gguf.py: a Hugging Face Qwen2 folder written as a GGUF in llama.cpp's names and
quantization, read back with the `gguf` package's own reader."""

import sys
from pathlib import Path

import numpy as np
import pytest
from test_models import CONFIGS, tiny_model_folder

from engine.models.gguf_convert import converted_folder
from engine.models.source import default_gguf_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
gguf = pytest.importorskip("gguf")
import shape_gguf


def test_the_tiny_qwen2_folder_becomes_a_q4_0_gguf_llama_cpp_can_name(tmp_path):
    folder = tiny_model_folder(tmp_path / "hf", "qwen2", converted_folder(default_gguf_path()))
    out = shape_gguf.write(folder, tmp_path / "tiny.gguf", "Q4_0")
    reader = gguf.GGUFReader(str(out))
    tensors = {t.name: t for t in reader.tensors}
    config = CONFIGS["qwen2"]
    assert "output.weight" not in tensors  # tied head: llama.cpp falls back to token_embd
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert tensors["blk.0.attn_k.bias"].tensor_type == gguf.GGMLQuantizationType.F32
    expected = {f"blk.{i}.{n}.weight" for i in range(config.num_hidden_layers) for n in shape_gguf.NAMES.values()}
    assert expected <= set(tensors) and "output_norm.weight" in tensors
    field = reader.fields["qwen2.block_count"]
    assert int(field.parts[field.data[0]][0]) == config.num_hidden_layers
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == 49152  # the embedded model's vocabulary, copied
    # the Q4_0 codes dequantize to the folder's weights within a step (half a step, or one where the
    # grid -8..7 clips the side opposite the block's largest magnitude)
    from safetensors.torch import load_file

    hf = load_file(str(folder / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"].float().numpy()
    q = tensors["blk.0.attn_q.weight"]
    back = gguf.quants.dequantize(q.data, q.tensor_type).reshape(hf.shape)
    step = np.abs(hf).reshape(hf.shape[0], -1, 32).max(-1, keepdims=True) / 8
    assert bool((np.abs(back - hf).reshape(step.shape[0], -1, 32) <= 1.01 * step + 1e-6).all())
