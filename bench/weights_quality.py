"""What a weight format costs and buys on a CPU: float32 ("full") against int4 (the CPU's "auto",
`engine.models.int4_cpu`) and NF4 (what a GPU gets, here on bitsandbytes' CPU path), on the embedded
SmolLM2-135M-Instruct.

    python bench/weights_quality.py                      # both parts, ~5 min on one idle core
    python bench/weights_quality.py --parts quality      # one part

Parts (each writes docs/bench/weights_<part>.{csv,json}):
  quality  the text of P05 (`engine.documents.load_document`, 18 pages), `--tokens` tokens of it in
           windows of 1,024 through the model's own forward (full attention, no cache compression,
           so only the weights differ): perplexity, and against float32's next-token distribution
           at every position mean KL(float32 || format) in nats and top-1 agreement. "int4" runs
           these 1,024-row windows as a prefill chunk does (the bfloat16 copy, where the CPU has
           AVX-512 BF16); "int4-kernel" without that copy, every row through the int4 kernel, as
           a decode step does.
  speed    the real engine: `DocumentSession` on the first ~2,000 tokens of P05 (recall off, the
           prefix cache off), each format opening it (prefill, 512-token chunks) and answering
           `--answers` questions of 64 tokens (greedy), the formats interleaved round by round in
           one process: median prefill tokens/s, seconds per 512-token chunk, decode tokens/s.

Run alone; `--threads` (default 1) pins torch, as the other benchmarks do.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile

import common

FORMATS = {"float32": "full", "int4": "int4", "int4-kernel": "int4", "nf4": "4bit"}  # row name -> the `weights` setting
QUESTIONS = [
    "What law does this document summarize?", "What does section 1201 prohibit?",
    "Who can be held liable under this law?", "What is the safe harbor for online service providers?",
    "What is a takedown notice?", "What exemptions does the law allow?", "When was the law enacted?",
]


def p05_text() -> str:
    from engine.documents import load_document

    return load_document(common.corpus_dir() / "pdf" / "P05_dmca.pdf").render()


def quality(models: dict, tokens: int) -> list[dict]:
    import torch

    from engine.models.loader import weight_bytes

    tokenizer = models["float32"].tokenizer
    ids = torch.tensor(tokenizer(p05_text(), add_special_tokens=False)["input_ids"][:tokens])
    windows = [ids[i : i + 1024] for i in range(0, len(ids) - 1, 1024) if len(ids[i : i + 1024]) > 1]
    logits = {}
    with torch.inference_mode():
        for name, lm in models.items():
            logits[name] = [lm.decoder.model(w[None]).logits[0, :-1].float() for w in windows]
    targets = torch.cat([w[1:] for w in windows])
    ref = torch.cat(logits["float32"])
    rows = []
    for name, lm in models.items():
        m = common.logit_metrics(ref, torch.cat(logits[name]), targets)
        rows.append({"weights": name, "label": lm.weights_label, "weight_mib": round(weight_bytes(lm.decoder.model) / 2**20, 1),
                     "tokens": int(targets.numel()), "ppl": round(math.exp(m["nll"]), 4),
                     "ppl_vs_float32_pct": round(100 * (math.exp(m["nll"] - m["ref_nll"]) - 1), 2),
                     "kl_nats": round(m["kl"], 5), "top1_agree": round(m["agree"], 4)})
    return rows


def speed(models: dict, answers: int) -> list[dict]:
    import torch

    from engine.session import DocumentSession
    from engine.settings import EngineSettings, RecallSettings

    tokenizer = models["float32"].tokenizer
    ids = tokenizer(p05_text(), add_special_tokens=False)["input_ids"][:2000]
    doc = os.path.join(tempfile.mkdtemp(dir=common.WORK), "p05-2k.txt")
    with open(doc, "w", encoding="utf-8") as handle:
        handle.write(tokenizer.decode(ids))
    settings = EngineSettings(threads=torch.get_num_threads(), prefix_cache=False, max_new_tokens=64,
                              recall=RecallSettings(archive=False, recall_tokens=0))
    samples = {name: {"prefill": [], "chunk": [], "decode": [], "tokens": 0} for name in models}
    for round_ in range(answers):
        for name, lm in models.items():  # interleaved: A B C, A B C, ...
            session = DocumentSession(lm, dataclasses.replace(settings, weights=FORMATS[name]))
            report = session.open(doc)
            samples[name]["prefill"].append(report.prefill_tokens_per_s)
            samples[name]["chunk"].append(512 / report.prefill_tokens_per_s)
            samples[name]["tokens"] = report.document_tokens
            answer = session.ask(QUESTIONS[round_ % len(QUESTIONS)])
            samples[name]["decode"].append(answer.decode_tokens_per_s)
            print(f"round {round_} {name}: prefill {report.prefill_tokens_per_s:.0f} tok/s, "
                  f"decode {answer.decode_tokens_per_s:.1f} tok/s", flush=True)
    rows = []
    for name, s in samples.items():
        rows.append({"weights": name, "label": models[name].weights_label, "document_tokens": s["tokens"],
                     "runs": len(s["decode"]), "prefill_tok_s": round(common.median(s["prefill"]), 1),
                     "chunk_s": round(common.median(s["chunk"]), 3),
                     "decode_tok_s": round(common.median(s["decode"]), 2),
                     "decode_all": [round(x, 2) for x in s["decode"]]})
    base = next(r for r in rows if r["weights"] == "float32")
    for row in rows:
        row["decode_vs_float32"] = round(row["decode_tok_s"] / base["decode_tok_s"], 2)
        row["prefill_vs_float32"] = round(row["prefill_tok_s"] / base["prefill_tok_s"], 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["quality", "speed"], choices=["quality", "speed"])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens of P05 for the quality part")
    parser.add_argument("--answers", type=int, default=5, help="answers per format for the speed part")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    args = parser.parse_args()
    common.setup(args.threads)
    from engine.models.loader import load_model

    names = ["float32"] + [f for f in args.formats if f != "float32"]
    models = {name: load_model("default", device="cpu", weights=FORMATS[name], threads=args.threads) for name in names}
    if "int4-kernel" in models:  # decode's path: drop the bfloat16 copy prefill chunks use
        for module in models["int4-kernel"].decoder.model.modules():
            if getattr(module, "dense", None) is not None:
                module.dense = None
    meta = {**common.machine_info(), "model": "SmolLM2-135M-Instruct (embedded Q4_1 GGUF)"}
    if "quality" in args.parts:
        columns = ["weights", "label", "weight_mib", "tokens", "ppl", "ppl_vs_float32_pct", "kl_nats", "top1_agree"]
        common.write_results("weights_quality", quality(models, args.tokens), columns, meta)
    if "speed" in args.parts:
        columns = ["weights", "label", "document_tokens", "runs", "prefill_tok_s", "chunk_s", "prefill_vs_float32",
                   "decode_tok_s", "decode_vs_float32"]
        rows = speed(models, args.answers)
        common.write_results("weights_speed", rows, columns, {**meta, "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]})


if __name__ == "__main__":
    main()
