"""A prepared check of the CUDA path, under 5 minutes on any NVIDIA GPU: the default model with the
GPU's default weights (NF4, bitsandbytes), a read of P05 (18 pages, ~9.7k tokens) and of the first
32k tokens of P16 (Think Python), three questions about each with recall on, the memory gauge's
numbers (`DocumentSession.memory`) against `torch.cuda.max_memory_allocated`, and prefill / decode
tokens/s; written to docs/bench/cuda_check.json.

    python bench/cuda_check.py             # on a machine with an NVIDIA GPU and a CUDA build of torch
    python bench/cuda_check.py --dry-run   # anywhere: builds the documents and the plan, loads no model

Without CUDA it exits with status 2 and says so. The prefix cache is off, so both documents are
read (prefilled) every run; each document's archive lives for the session only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import common

P16_TOKENS = 32_768
QUESTIONS = {
    "P05_dmca.pdf": ["What law does this document summarize?", "What is a takedown notice?",
                     "What does section 1201 prohibit?"],
    common.THINK_PYTHON: ["What is a variable?", "What does the print function do?", "What is debugging?"],
}
MAX_NEW_TOKENS = 64
TIME_LIMIT_S = 290  # stop asking more questions past this, to stay under 5 minutes


def documents(tokenizer) -> list:
    """P05 whole, and the first pages of P16 that stay within `P16_TOKENS` tokens (as rendered)."""
    from engine.documents import load_document

    pdf = common.corpus_dir() / "pdf"
    p05 = load_document(pdf / "P05_dmca.pdf")
    p16 = load_document(pdf / common.THINK_PYTHON)
    kept, tokens = [], 0
    for segment in p16.segments:
        tokens += len(tokenizer(segment.text, add_special_tokens=False)["input_ids"]) + 8  # + its marker
        if tokens > P16_TOKENS:
            break
        kept.append(segment)
    first = dataclasses.replace(p16, segments=kept)
    # The per-page estimate misses tokens merged across page boundaries; the rendered text decides.
    while len(tokenizer(first.render(), add_special_tokens=False)["input_ids"]) > P16_TOKENS:
        kept.pop()
        first = dataclasses.replace(p16, segments=kept)
    return [p05, dataclasses.replace(first, title=f"{p16.title} (first {len(kept)} pages)")]


def gauge(memory) -> dict:
    """The gauge's numbers (`engine.memory.MemoryReport`), in bytes."""
    return {"weights": memory.weights_bytes, "kv": memory.kv_bytes, "workspace": memory.workspace_bytes,
            "budget_mark": memory.budget_bytes, "device_total": memory.device_total_bytes,
            "device_free": memory.device_free_bytes}


def cuda_numbers(torch) -> dict:
    return {"allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.memory_reserved()}


def run(docs: list, began: float) -> dict:
    import torch

    from engine.models.loader import load_model
    from engine.session import DocumentSession
    from engine.settings import EngineSettings

    torch.cuda.reset_peak_memory_stats()
    model = load_model("default", device="cuda")
    after_load = cuda_numbers(torch)
    settings = EngineSettings(prefix_cache=False, max_new_tokens=MAX_NEW_TOKENS)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "weights": model.weights_label, "weight_bytes": model.weight_bytes, "load_s": round(model.load_seconds, 1),
              "cuda_after_load": after_load, "documents": []}
    session = DocumentSession(model, settings)
    for doc in docs:
        torch.cuda.reset_peak_memory_stats()
        report = session.open(doc)
        row = {"title": doc.title, "tokens": report.document_tokens, "position_mode": report.position_mode,
               "prefill_s": round(report.prefill_seconds, 2), "prefill_tok_s": round(report.prefill_tokens_per_s, 1),
               "gauge_after_read": gauge(session.memory()), "cuda_read": cuda_numbers(torch), "answers": []}
        for question in QUESTIONS[doc.source.rsplit("/", 1)[-1]]:
            if time.perf_counter() - began > TIME_LIMIT_S:
                row["answers"].append({"question": question, "skipped": "time limit"})
                continue
            torch.cuda.reset_peak_memory_stats()
            answer = session.ask(question)
            recall = answer.recall
            row["answers"].append({
                "question": question, "text": answer.text, "ttft_s": round(answer.time_to_first_token_s, 3),
                "decode_tok_s": round(answer.decode_tokens_per_s, 1), "tokens": len(answer.token_ids),
                "recalled_tokens": recall.tokens_recalled if recall else 0,
                "sources": [f"{s.label} ({s.share:.0%})" for s in answer.sources],
                "gauge": gauge(session.memory()), "cuda": cuda_numbers(torch)})
        result["documents"].append(row)
        print(f"{doc.title}: {report.document_tokens} tokens, prefill {report.prefill_tokens_per_s:.0f} tok/s, "
              f"decode {[a.get('decode_tok_s') for a in row['answers']]} tok/s", flush=True)
    session.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="build the documents and print the plan; no model, no GPU")
    args = parser.parse_args()
    began = time.perf_counter()
    common.setup(threads=1)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("cuda_check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with an "
              "NVIDIA GPU and a CUDA build of torch, or pass --dry-run", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(common.hf_folder())
    docs = documents(tokenizer)
    plan = {"documents": {d.title: len(tokenizer(d.render(), add_special_tokens=False)["input_ids"]) for d in docs},
            "questions": QUESTIONS, "max_new_tokens": MAX_NEW_TOKENS}
    if args.dry_run:
        print(json.dumps(plan, indent=1))
        return 0
    result = {"meta": common.machine_info(), "plan": plan, **run(docs, began)}
    result["seconds"] = round(time.perf_counter() - began, 1)
    (common.OUT / "cuda_check.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {common.OUT / 'cuda_check.json'} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
