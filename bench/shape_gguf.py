"""The Qwen2.5-1.5B shape's Hugging Face folder (bench/speed.py `shape_folder`, seeded random
weights) as a GGUF that llama.cpp loads, for the `llamacpp` part of bench/speed.py:

    python bench/shape_gguf.py FOLDER OUT.gguf [--type Q4_0]

Architecture `qwen2` (llama.cpp's names: token_embd, blk.N.attn_q / attn_k / attn_v with biases,
attn_output, ffn_gate / ffn_up / ffn_down, attn_norm / ffn_norm, output_norm; no `output`: the
head is tied to the embedding, as in the folder). Decoder linear weights in `--type` (Q4_0 or Q8_0,
quantized by the `gguf` package's numpy reference, llama.cpp's own rounding); the embedding, which
is also the LM head, in Q8_0 as our int4 load holds the head; norms and biases float32. The
tokenizer fields are the embedded model's GGUF's (the folder uses its vocabulary). Q4_K_M is not
written: the `gguf` package quantizes no K-quants.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str | None:
    """llama.cpp's tensor name for a Hugging Face Qwen2 tensor name (None: not written)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    parts = hf.split(".")  # model.layers.N.<module>.<weight|bias>
    if parts[:2] != ["model", "layers"]:
        return None  # lm_head.weight: tied to the embedding
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{NAMES[module]}.{parts[-1]}" if module in NAMES else None


def copy_tokenizer(writer, source: Path) -> None:
    """Every `tokenizer.*` field of the GGUF `source`, as it is."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            inner = field.types[1]
            values = [_scalar(field.parts[i], inner) for i in field.data]
            writer.add_array(name, values)
        else:
            writer.add_key_value(name, _scalar(field.parts[field.data[0]], kind), kind)


def _scalar(part, kind):
    import gguf

    return bytes(part).decode("utf-8") if kind == gguf.GGUFValueType.STRING else part.tolist()[0]


def write(folder: Path, out: Path, qtype: str = "Q4_0", tokenizer_gguf: Path | None = None) -> Path:
    """Write the GGUF (module docstring) and return `out`. Reads one tensor at a time."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    from engine.models.source import default_gguf_path

    config = json.loads((folder / "config.json").read_text())
    layer_type = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(out), "qwen2")
    writer.add_name("Qwen2.5-1.5B shape (random weights)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(float(config.get("rope_theta", 1e6)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qtype == "Q4_0" else gguf.LlamaFileType.MOSTLY_Q8_0)
    copy_tokenizer(writer, tokenizer_gguf or default_gguf_path())
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for hf in handle.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                name = gguf_name(hf)
                if name is None:
                    continue
                data = handle.get_tensor(hf).float().numpy()
                if name == "token_embd.weight":
                    kind = gguf.GGMLQuantizationType.Q8_0
                elif data.ndim == 2:
                    kind = layer_type
                else:
                    writer.add_tensor(name, data.astype(np.float32))
                    continue
                writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q8_0"])
    args = ap.parse_args()
    print(write(args.folder, args.out, args.type))


if __name__ == "__main__":
    main()
