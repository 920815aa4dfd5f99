"""Speed: prefill tokens/s and decode ms/token vs. context length; time to first token, cold and warm.

    python bench/kv_speed.py                       # ~30-60 min on 2 shared cores
    python bench/kv_speed.py --lengths 1024 4096 8192 16384 32768 --repeats 3 --ttft-pages 60

Same model object (float32 weights, as in kv_quality.py; `--nf4-probe` adds one 1k-token row with
the app's NF4 4-bit weights), 1 torch thread, same Think Python tokens, same
512-token chunks for both caches, runs interleaved (ours, transformers, ours, ...) so that load from
other processes hits both alike:
  ours          Halaman's default policy (budget 4,096, INT4, window 1,024), compact positions
  transformers  DynamicCache (full FP32 cache), the model's own forward, sdpa attention
One run to L tokens gives the prefill rate at every checkpoint below L (the first n tokens of a
longer prefill are exactly an n-token prefill); at each checkpoint the cache is copied and
`--decode-steps` greedy tokens are timed (median ms/token), then the copy is dropped.
TTFT: DocumentSession + PrefixStore in a scratch dir on the first `--ttft-pages` pages of Think
Python (a PDF written with pypdf): cold = open (read + prefill + save) then ask until the first
token; warm = a new session opening the same file (prefix-cache hit) then ask.
llama.cpp (llama-cpp-python in bench/.venv-llamacpp, if it built) runs the same GGUF and tokens.
"""

from __future__ import annotations

import argparse
import json
import time

import common


def _decode_kwargs(lm) -> dict:
    """Decode as DocumentSession does: with the decode workspace on CPU where the engine has one."""
    import inspect

    return {"reuse_workspace": True} if "reuse_workspace" in inspect.signature(lm.decoder.forward).parameters else {}


def trace_ours(lm, ids, checkpoints, decode_steps):
    import torch

    from engine.settings import CachePolicy

    cache = lm.decoder.new_cache(CachePolicy(), "compact")
    out, elapsed = {}, 0.0
    step = cache.policy.chunk_tokens
    for first in range(0, max(checkpoints), step):
        t0 = time.perf_counter()
        lm.decoder.forward(ids[first : first + step], cache)
        elapsed += time.perf_counter() - t0
        n = first + step
        if n in checkpoints:
            twin, times, token = cache.fork(), [], 42
            for _ in range(decode_steps):
                t0 = time.perf_counter()
                logits = lm.decoder.forward(torch.tensor([token]), twin, slack_tokens=32, **_decode_kwargs(lm))
                times.append(time.perf_counter() - t0)
                token = int(logits[-1].argmax())
            out[n] = {"prefill_tok_s": n / elapsed, "decode_ms": 1000 * common.median(times), "kv_bytes": cache.memory().total_bytes}
    return out


def trace_hf(lm, ids, checkpoints, decode_steps, chunk=512):
    out = {}
    for n, elapsed, _last, times, cache in common.hf_trace(lm, ids, checkpoints, decode_steps, chunk):
        assert cache.get_seq_length() == n
        kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
        out[n] = {"prefill_tok_s": n / elapsed, "decode_ms": 1000 * common.median(times), "kv_bytes": kv}
    return out


def cpu_probe(lm, ids, lengths: list[int], repeats: int, decode_steps: int) -> list[dict]:
    """CPU seconds (time.process_time: what this process itself used, whatever the machine's load),
    ours vs. transformers interleaved: prefill n tokens in 512-token chunks, then greedy decode."""
    import torch
    from transformers import DynamicCache

    from engine.settings import CachePolicy

    def ours(n):
        cache = lm.decoder.new_cache(CachePolicy(), "compact")
        c0 = time.process_time()
        lm.decoder.prefill(ids[:n], cache)
        c1 = time.process_time()
        steps = []
        for _ in range(decode_steps):
            t = time.process_time()
            lm.decoder.forward(torch.tensor([42]), cache, slack_tokens=32, **_decode_kwargs(lm))
            steps.append(time.process_time() - t)
        return c1 - c0, steps

    def theirs(n):
        cache, model = DynamicCache(), lm.decoder.model
        with torch.inference_mode():
            c0 = time.process_time()
            for first in range(0, n, 512):
                model(ids[None, first : min(first + 512, n)], past_key_values=cache, logits_to_keep=1)
            c1 = time.process_time()
            steps = []
            for _ in range(decode_steps):
                t = time.process_time()
                model(torch.tensor([[42]]), past_key_values=cache)
                steps.append(time.process_time() - t)
        return c1 - c0, steps

    got: dict = {}
    for n in lengths:
        for rep in range(repeats if n == lengths[0] else 1):
            for name, fn in (("ours (budget 4,096 + INT4)", ours), ("transformers DynamicCache (full)", theirs)):
                prefill_s, steps = fn(n)
                got.setdefault((name, n), []).append((n / prefill_s, 1000 * common.median(steps)))
                print(json.dumps({"cache": name, "tokens": n, "rep": rep, "cpu_prefill_tok_s": n / prefill_s}), flush=True)
    rows = []
    for (name, n), vals in got.items():
        rows.append({"cache": name, "tokens": n, "runs": len(vals), "cpu_prefill_tok_s": common.median([v[0] for v in vals]),
                     "cpu_decode_ms": common.median([v[1] for v in vals])})
    for row in rows:
        if row["cache"].startswith("ours"):
            hf = next(r for r in rows if r["tokens"] == row["tokens"] and r is not row)
            row["prefill_vs_transformers"] = row["cpu_prefill_tok_s"] / hf["cpu_prefill_tok_s"]
            row["decode_vs_transformers"] = row["cpu_decode_ms"] / hf["cpu_decode_ms"]
    return rows


def ttft(model, pages: int, repeats: int) -> list[dict]:
    """Cold and warm open + first answer token through DocumentSession with a PrefixStore."""
    import shutil

    from pypdf import PdfReader, PdfWriter

    from engine.prefix_store import PrefixStore
    from engine.session import DocumentSession
    from engine.settings import EngineSettings

    pdf = common.WORK / f"thinkpython-first{pages}.pdf"
    writer = PdfWriter()
    for page in PdfReader(common.corpus_dir() / "pdf" / common.THINK_PYTHON).pages[:pages]:
        writer.add_page(page)
    with pdf.open("wb") as handle:
        writer.write(handle)
    store_dir = common.WORK / "prefix-store"
    shutil.rmtree(store_dir, ignore_errors=True)
    settings = EngineSettings(max_new_tokens=4)
    rows = []
    for run in range(1 + repeats):
        store = PrefixStore(store_dir, disk_budget_bytes=settings.prefix_cache_disk_bytes)
        session = DocumentSession(model, settings, store)
        began = time.perf_counter()
        report = session.open(str(pdf))
        answer = session.ask("What is this document about?")
        total = time.perf_counter() - began
        rows.append({"open": "warm (prefix hit)" if report.prefix_hit else "cold (prefill)", "pages": pages,
                     "document_tokens": report.document_tokens, "open_s": report.seconds, "prefill_s": report.prefill_seconds,
                     "ask_ttft_s": answer.time_to_first_token_s, "time_to_first_token_s": report.seconds + answer.time_to_first_token_s, "total_s": total, "kv_mib": report.kv.total_bytes / 2**20})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(rows: list[dict], llama: dict) -> None:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for cache, style in (("ours (budget 4,096 + INT4)", "o-"), ("transformers DynamicCache (full)", "s-")):
        sub = [r for r in rows if r["cache"] == cache]
        xs = [r["tokens"] for r in sub]
        a.plot(xs, [r["prefill_tok_s"] for r in sub], style, label=cache)
        b.plot(xs, [r["decode_ms"] for r in sub], style, label=cache)
    if "rows" in llama:
        xs = [r["tokens"] for r in llama["rows"]]
        a.plot(xs, [r["prefill_tok_s"] for r in llama["rows"]], "^--", label="llama.cpp (Q4_1 GGUF, full cache)")
        b.plot(xs, [r["decode_ms"] for r in llama["rows"]], "^--", label="llama.cpp (Q4_1 GGUF, full cache)")
    for ax, title in ((a, "prefill tokens/s (higher is better)"), (b, "decode ms/token (lower is better)")):
        ax.set(xscale="log", title=title, xlabel="context tokens")
        ticks = sorted({r["tokens"] for r in rows})
        ax.set_xticks(ticks, [f"{t // 1024}k" for t in ticks])
        ax.axvline(8192, color="grey", lw=0.8, ls=":")
    a.set_yscale("log")
    a.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M, CPU, 1 thread, shared machine (medians)", fontsize=9)
    fig.tight_layout()
    fig.savefig(common.OUT / "kv_speed.png")


def plot_cpu(rows: list[dict]) -> None:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    lengths = sorted({r["tokens"] for r in rows})
    for i, (cache, color) in enumerate((("ours (budget 4,096 + INT4)", "C0"), ("transformers DynamicCache (full)", "C1"))):
        sub = {r["tokens"]: r for r in rows if r["cache"] == cache}
        xs = [j + 0.38 * i for j in range(len(lengths))]
        a.bar(xs, [sub[n]["cpu_prefill_tok_s"] for n in lengths], 0.36, color=color, label=cache)
        b.bar(xs, [sub[n]["cpu_decode_ms"] for n in lengths], 0.36, color=color, label=cache)
    for ax, title in ((a, "prefill tokens per CPU-second (higher is better)"), (b, "decode CPU-ms per token (lower is better)")):
        ax.set_xticks([j + 0.19 for j in range(len(lengths))], [f"{n:,} tokens" for n in lengths])
        ax.set_title(title)
    a.legend(fontsize=7)
    fig.suptitle("CPU time of this process only (time.process_time), SmolLM2-135M FP32 weights, 1 thread", fontsize=9)
    fig.tight_layout()
    fig.savefig(common.OUT / "kv_speed_cpu.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 8192, 16384])
    ap.add_argument("--repeats", type=int, default=3, help="runs to --repeat-max tokens (median of these)")
    ap.add_argument("--repeat-max", type=int, default=1024, help="runs after the first stop here (CPU time)")
    ap.add_argument("--hf-max", type=int, default=8192, help="longest transformers run (the model has 8,192 positions)")
    ap.add_argument("--decode-steps", type=int, default=9)
    ap.add_argument("--nf4-probe", type=int, default=1024, help="tokens for the NF4-weights row (0 = skip)")
    ap.add_argument("--ttft-pages", type=int, default=10)
    ap.add_argument("--ttft-repeats", type=int, default=3, help="warm opens after the cold one")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu-probe", type=int, nargs="*", metavar="TOKENS",
                    help="only the CPU-time comparison at these lengths (first one repeated --repeats times)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["trace", "ttft", "llamacpp"])
    args = ap.parse_args()
    common.setup(args.threads)
    began = time.perf_counter()
    meta = common.machine_info()
    import torch

    from engine.models.loader import load_model

    lm = load_model("default", device="cpu", weights="full")
    book = common.book_token_ids(lm.tokenizer)
    ids = torch.tensor(book[: max(args.lengths + (args.cpu_probe or []))])
    if args.cpu_probe:
        rows = cpu_probe(lm, ids, args.cpu_probe, args.repeats, args.decode_steps)
        common.write_results("kv_speed_cpu", rows, ["cache", "tokens", "runs", "cpu_prefill_tok_s", "cpu_decode_ms",
                                                    "prefill_vs_transformers", "decode_vs_transformers"], meta)
        plot_cpu(rows)
        print(f"kv_speed --cpu-probe: {time.perf_counter() - began:.0f} s")
        return
    runs = {"ours (budget 4,096 + INT4)": [], "transformers DynamicCache (full)": []}
    if "trace" not in args.skip:
        for rep in range(args.repeats):
            marks = args.lengths if rep == 0 else [n for n in args.lengths if n <= args.repeat_max]
            runs["ours (budget 4,096 + INT4)"].append(trace_ours(lm, ids, marks, args.decode_steps))
            hf_marks = [n for n in marks if n <= args.hf_max]
            runs["transformers DynamicCache (full)"].append(trace_hf(lm, ids, hf_marks, args.decode_steps) if hf_marks else {})
            print(json.dumps({"repeat": rep, **{k: v[-1] for k, v in runs.items()}}), flush=True)
    rows = []
    for cache, traces in runs.items():
        for n in args.lengths:
            got = [t[n] for t in traces if n in t]
            if got:
                rows.append({"cache": cache, "tokens": n, "runs": len(got),
                             "prefill_tok_s": common.median([g["prefill_tok_s"] for g in got]),
                             "decode_ms": common.median([g["decode_ms"] for g in got]), "kv_mib": got[0]["kv_bytes"] / 2**20})
    for n in args.lengths:  # side-by-side ratios from the same repeats
        ours = next((r for r in rows if r["cache"].startswith("ours") and r["tokens"] == n), None)
        hf = next((r for r in rows if r["cache"].startswith("transformers") and r["tokens"] == n), None)
        if ours and hf:
            ours["prefill_vs_transformers"] = ours["prefill_tok_s"] / hf["prefill_tok_s"]
            ours["decode_vs_transformers"] = ours["decode_ms"] / hf["decode_ms"]
    if args.nf4_probe:  # the app's NF4 weights: one run, same tokens, side by side
        nf4 = load_model("default", device="cpu", weights="4bit")
        for cache, fn in (("ours (budget 4,096 + INT4)", trace_ours), ("transformers DynamicCache (full)", trace_hf)):
            got = fn(nf4, ids, [args.nf4_probe], args.decode_steps)[args.nf4_probe]
            rows.append({"cache": cache + ", NF4 weights", "tokens": args.nf4_probe, "runs": 1, "prefill_tok_s": got["prefill_tok_s"],
                         "decode_ms": got["decode_ms"], "kv_mib": got["kv_bytes"] / 2**20})
        del nf4
    llama = {} if "llamacpp" in args.skip else common.llama_cpp(book, args.lengths, args.decode_steps, args.threads)
    for r in llama.get("rows", []):
        rows.append({"cache": "llama.cpp (Q4_1 GGUF, full cache)", **r})
    meta["llama_cpp"] = llama.get("version", llama.get("error"))
    common.write_results("kv_speed", rows, ["cache", "tokens", "runs", "prefill_tok_s", "decode_ms", "kv_mib",
                                            "prefill_vs_transformers", "decode_vs_transformers"], meta)
    plot(rows, llama)
    if "ttft" not in args.skip:
        common.write_results("kv_ttft", ttft(lm, args.ttft_pages, args.ttft_repeats),
                             ["open", "pages", "document_tokens", "open_s", "prefill_s", "ask_ttft_s", "time_to_first_token_s", "kv_mib"], meta)
    print(f"kv_speed: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
