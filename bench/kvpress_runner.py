"""Run kvpress presses on the same model, prompts and greedy decoding as bench/kv_quality.py.

Runs inside bench/.venv-kvpress (kvpress 0.5.5 pins transformers < 5.3, so it cannot share the
project's environment; see bench/README.md). It imports nothing from Halaman:

    bench/.venv-kvpress/bin/python bench/kvpress_runner.py TASKS.json RESULTS.json

TASKS.json: {"model_dir", "threads", "presses": [names], "passkey_presses": [names, default all],
             "passkey": [{"id", "context", "question", "max_new_tokens", "ratios"}],
             "continuation": [{"id", "context", "continuation", "ratios"}]}
(ratios: fractions of the context's tokens removed, kvpress's `compression_ratio`).
Each context is prefilled once per (press, ratio) under the press (kvpress compresses the whole
context after each layer's prefill), then the question is decoded greedily, or the continuation is
scored teacher-forced, exactly as kvpress's own pipeline does (explicit position ids after the
context). "none" is the full DynamicCache, the reference for KL and agreement (its logits are kept
next to RESULTS.json). RESULTS.json is rewritten after every run; a rerun skips what it holds.
"""

from __future__ import annotations

import json
import os
import sys
import time


def make_press(name: str, ratio: float):
    from kvpress import ExpectedAttentionPress, ObservedAttentionPress, SnapKVPress, StreamingLLMPress

    presses = {
        "streaming_llm": lambda: StreamingLLMPress(compression_ratio=ratio, n_sink=4),
        "snapkv": lambda: SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
        "observed_attention": lambda: ObservedAttentionPress(compression_ratio=ratio),
        "expected_attention": lambda: ExpectedAttentionPress(compression_ratio=ratio),
    }
    return presses[name]()


def prefill(model, press, context):
    """Prefill `context` [1, n] into a fresh DynamicCache under `press`; returns (cache, seconds)."""
    import contextlib

    from transformers import DynamicCache

    cache = DynamicCache()
    began = time.perf_counter()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=context, past_key_values=cache)
    return cache, time.perf_counter() - began


def greedy(model, cache, question, start: int, max_new_tokens: int, eos: set[int]) -> list[int]:
    """kvpress pipeline's generate_answer: question then greedy tokens at positions start, start+1, ..."""
    import torch

    pos = torch.arange(start, start + question.shape[1])[None]
    logits = model(input_ids=question, past_key_values=cache, position_ids=pos, logits_to_keep=1).logits
    out = [int(logits[0, -1].argmax())]
    nxt = pos[:, -1:] + 1
    for i in range(max_new_tokens - 1):
        if out[-1] in eos:
            break
        logits = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, position_ids=nxt + i).logits
        out.append(int(logits[0, -1].argmax()))
    return out


def continuation_logits(model, cache, continuation, start: int):
    import torch

    pos = torch.arange(start, start + continuation.shape[1])[None]
    return model(input_ids=continuation, past_key_values=cache, position_ids=pos).logits[0].float()


def main() -> None:
    tasks_path, results_path = sys.argv[1], sys.argv[2]
    tasks = json.loads(open(tasks_path).read())
    import torch

    torch.set_num_threads(int(tasks.get("threads", 1)))
    import kvpress
    import safetensors.torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    model = AutoModelForCausalLM.from_pretrained(tasks["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    results = {"versions": {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
                            "transformers": transformers.__version__, "torch": torch.__version__},
               "passkey": [], "continuation": [], "errors": []}
    if os.path.exists(results_path):  # resume: keep finished rows of the same prompts
        old = json.loads(open(results_path).read())
        results["passkey"] = [r for r in old["passkey"] if r["id"] in {j["id"] for j in tasks.get("passkey", [])}]
        results["continuation"] = [r for r in old["continuation"] if r["id"] in {j["id"] for j in tasks.get("continuation", [])}
                                   and (r["press"] != "none" or os.path.exists(_ref_path(results_path, r["id"])))]
    done = {(kind, r["press"], r["ratio"], r["id"]) for kind in ("passkey", "continuation") for r in results[kind]}
    with torch.inference_mode():
        for name in ["none"] + tasks["presses"]:
            model.set_attn_implementation("eager" if name == "observed_attention" else "sdpa")
            for job in tasks.get("passkey", []) if name in tasks.get("passkey_presses", ["none"] + tasks["presses"]) else []:
                ctx, question = torch.tensor([job["context"]]), torch.tensor([job["question"]])
                for ratio in [0.0] if name == "none" else job["ratios"]:
                    if ("passkey", name, ratio, job["id"]) in done:
                        continue
                    try:
                        cache, secs = prefill(model, None if name == "none" else make_press(name, ratio), ctx)
                        kept = cache.get_seq_length(0)
                        gen = greedy(model, cache, question, ctx.shape[1], job["max_new_tokens"], eos)
                    except Exception as exc:  # noqa: BLE001 - record and go on with the other presses
                        results["errors"].append(f"{name} {ratio} {job['id']}: {type(exc).__name__}: {exc}")
                        continue
                    results["passkey"].append({"id": job["id"], "press": name, "ratio": ratio, "generated": gen,
                                               "kept_tokens": kept, "prefill_s": secs})
                    _save(results_path, results)
            for job in tasks.get("continuation", []):
                ctx, cont = torch.tensor([job["context"]]), torch.tensor([job["continuation"]])
                ref_path = _ref_path(results_path, job["id"])
                for ratio in [0.0] if name == "none" else job["ratios"]:
                    if ("continuation", name, ratio, job["id"]) in done:
                        continue
                    try:
                        cache, secs = prefill(model, None if name == "none" else make_press(name, ratio), ctx)
                        kept = cache.get_seq_length(0)
                        logits = continuation_logits(model, cache, cont, ctx.shape[1])
                    except Exception as exc:  # noqa: BLE001
                        results["errors"].append(f"{name} {ratio} {job['id']}: {type(exc).__name__}: {exc}")
                        continue
                    if name == "none":  # the full-cache logits, kept for a resumed run
                        safetensors.torch.save_file({"logits": logits.contiguous()}, ref_path)
                    ref = safetensors.torch.load_file(ref_path)["logits"]
                    targets = cont[0, 1:]
                    p = torch.log_softmax(ref[:-1], -1)
                    q = torch.log_softmax(logits[:-1], -1)
                    results["continuation"].append({
                        "id": job["id"], "press": name, "ratio": ratio, "kept_tokens": kept, "prefill_s": secs,
                        "kl": float((p.exp() * (p - q)).sum(-1).mean()),
                        "agree": float((p.argmax(-1) == q.argmax(-1)).float().mean()),
                        "nll": float(-q.gather(1, targets[:, None]).mean()),
                        "ref_nll": float(-p.gather(1, targets[:, None]).mean()),
                    })
                    _save(results_path, results)
            print(f"kvpress {name} done", flush=True)
    _save(results_path, results)


def _ref_path(results_path: str, job_id: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(results_path)), f"kvpress-reference-{job_id}.safetensors")


def _save(path: str, results: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(results, handle)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
