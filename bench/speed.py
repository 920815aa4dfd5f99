"""Speed, one command: reading (prefill) and answering (decode) tokens/s at 2k, 4k, 8k, 32k and the
whole of Think Python (P16), for Halaman, transformers' full DynamicCache and llama.cpp (where
bench/.venv-llamacpp exists), with the ratios; plus the levers side by side and prompt-lookup
drafts on real questions.

    python bench/speed.py                        # every part, ~45 min on two idle cores
    python bench/speed.py --parts levers drafts  # one or more parts
    python bench/speed.py --lengths 2048 4096    # shorter lengths part (no whole book)
    python bench/speed.py --parts lengths --lengths 8192 --no-whole-book --runs 3   # the speed bar, three runs

Parts (each writes docs/bench/speed_<part>.{csv,json}; `lengths` also docs/bench/speed_lengths.png):
  lengths  ours = the app's CPU path: default policy (budget 4,096, INT4, compact positions past
           8k), the CPU default weights ("auto": int4), the INT4 archive written during the read, 512-token
           chunks. transformers = the same weights and tokens through the model's own forward with a
           DynamicCache (sdpa), up to the model's 8,192 positions. llama.cpp = the same GGUF and token
           ids, f16 KV cache. Prefill tok/s is over the whole prefix so far; "chunk tok/s" is the rate
           of the last 512-token chunk (flat when the budget is full). Decode = median of
           `--decode-steps` one-token steps, no drafting, right after the prefill.
  levers   in one process, interleaved, 3 rounds: NF4 4-bit vs float32 weights; 1 vs 2 threads.
  drafts   10 questions each about P05 and the first 40 pages of P16 through DocumentSession with the
           default settings (recall on), drafts off vs on: decode tok/s, acceptance, same tokens.
  shape    a model shaped like Qwen2.5-1.5B-Instruct (its catalog config, the embedded tokenizer's
           49,152-token vocabulary, random weights: nothing downloaded), int4 weights as the app loads
           them on a CPU: ours vs transformers' DynamicCache over the same weights at `--shape-tokens`,
           read and decode tokens/s, weights and peak memory, and the roofline of this CPU (memory
           bandwidth and float32 matmul rate measured here) that bounds them.
  llamacpp llama.cpp's `llama-bench` (a binary given by `--llama-bench PATH`; skipped without one):
           pp512 and tg128 (`--llama-prompt` / `--llama-gen`) at threads 1 and 2, 3 repetitions, on the
           shape's weights written as a GGUF (bench/shape_gguf.py: Q4_0 layers, Q8_0 embedding and
           tied head) and on the embedded model's GGUF as is (Q4_1); beside them ours on the same
           weights in the same run: the first 512 tokens of the book read (the app's path, as in
           `lengths`), then `--decode-steps` steps, at threads 1 and 2.
  before   `--before REV` against this checkout: each in its own process (a git worktree of REV in
           bench/.work), the app's default weights at that commit, 8,192 tokens through the decoder
           and 16 decode steps, same threads: model load, prefill, chunk and decode rates.

Threads: `--threads 0` (default) lets the engine measure idle cores, as the app does; the table
records the count and the load average. Run alone: nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import common

P05 = "P05_dmca.pdf"
P05_QUESTIONS = [
    "What law does this document summarize?", "What does section 1201 prohibit?",
    "Who can be held liable under this law?", "What is the safe harbor for online service providers?",
    "What is a takedown notice?", "What exemptions does the law allow?", "When was the law enacted?",
    "What does the document say about encryption research?", "What are the penalties for violations?",
    "Summarize the document in two sentences.",
]
P16_QUESTIONS = [
    "What programming language does this book teach?", "What is the title of this book?",
    "What is a variable?", "What does the print function do?", "What is a function?",
    "What is a bug?", "What is the difference between an interpreter and a compiler?",
    "What is debugging?", "What is an expression?", "Who wrote this book?",
]


def load_avg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------ shape
def shape_folder() -> Path:
    """A Hugging Face folder shaped like Qwen2.5-1.5B-Instruct with seeded random bfloat16 weights and
    the embedded model's tokenizer (its vocabulary, so the book's token ids fit), made once under
    bench/.work."""
    import shutil
    import tomllib

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    folder = common.WORK / "qwen2.5-1.5b-shape"
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    catalog = tomllib.loads((common.REPO / "engine" / "models" / "catalog.toml").read_text())
    spec = next(m for m in catalog["model"] if m["id"] == "qwen2.5-1.5b")
    tokenizer_folder = common.hf_folder()
    vocab = json.loads((tokenizer_folder / "config.json").read_text())["vocab_size"]
    config = Qwen2Config(hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
                         num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
                         num_key_value_heads=spec["num_key_value_heads"], vocab_size=vocab,
                         max_position_embeddings=spec["max_position_embeddings"], tie_word_embeddings=True,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "chat_template.jinja"):  # the chat template: `halaman ask` (bench/first_answer.py) needs one
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def roofline() -> dict:
    """This CPU's ceilings, measured: memory bandwidth (GB/s, median of 5 copies of 512 MiB: read +
    write counted) and float32 matmul rate (GFLOP/s, median of 5 2048³ products)."""
    import torch

    bandwidth = common.copy_bandwidth_gb_s()
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    products = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        products.append(time.perf_counter() - t0)
    return {"bandwidth_gb_s": bandwidth,
            "matmul_gflop_s": 2 * 2048 ** 3 / common.median(products) / 1e9}


def decode_read_bytes(model) -> int:
    """Bytes of weights one decode step reads (not the KV cache's): an int4 layer's codes, scales and zeros, or its int8
    step copy where it keeps one (`Int4Linear._kernel_output`), never its bfloat16 reading copy (for
    chunks only); one row of the input embedding (a gather), not the table; every other parameter
    and buffer once. Tied tensors count once."""
    import torch

    from engine.models.int4_cpu import Int4Linear

    total, seen = 0, set()

    def add(tensor) -> None:
        nonlocal total
        if tensor is not None and id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()

    embedding = model.get_input_embeddings()  # skipped below; a head tied to it as a Linear counts it whole
    total += embedding.weight.shape[1] * embedding.weight.element_size()
    for module in model.modules():
        if isinstance(module, Int4Linear):
            for tensor in (module.step_codes, module.step_scales) if module.step_codes is not None else (module.packed, module.scales_and_zeros):
                add(tensor)
            add(module.bias)
        elif not isinstance(module, torch.nn.Embedding):
            for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
                add(tensor)
    return total


def part_shape(book, args, threads) -> list[dict]:
    import resource

    import torch

    from engine.models.loader import load_model

    folder = shape_folder()
    lm = load_model(str(folder), device="cpu", weights="int4", threads=threads)
    n = args.shape_tokens
    ids = torch.tensor(book[:n])
    with tempfile.TemporaryDirectory() as tmp:
        ours = trace_ours(lm, ids, [n], args.decode_steps, Path(tmp))[n]
    theirs = trace_hf(lm, ids, [n], args.decode_steps)[n]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ceilings = roofline()
    params = lm.parameters
    # Decode reads once per token every weight a step uses: the bandwidth bound. Prefill does 2 FLOPs
    # per parameter per token: the matmul bound (float32 rate; the int4 kernel dequantizes on the fly).
    step_bytes = decode_read_bytes(lm.decoder.model)
    decode_bound = ceilings["bandwidth_gb_s"] * 1e9 / step_bytes
    prefill_bound = ceilings["matmul_gflop_s"] * 1e9 / (2 * params)
    common_cols = {"model": "Qwen2.5-1.5B shape (random weights)", "weights": lm.weights_label, "tokens": n,
                   "parameters": params, "weight_bytes": lm.weight_bytes, "decode_read_bytes": step_bytes, "peak_rss_bytes": peak, **ceilings,
                   "decode_bound_tok_s": decode_bound, "prefill_bound_tok_s": prefill_bound}
    return [{**common_cols, "engine": "ours", **ours,
             "decode_of_bound": ours["decode_tok_s"] / decode_bound, "prefill_of_bound": ours["prefill_tok_s"] / prefill_bound,
             "prefill_vs_transformers": ours["prefill_tok_s"] / theirs["prefill_tok_s"],
             "decode_vs_transformers": ours["decode_tok_s"] / theirs["decode_tok_s"]},
            {**common_cols, "engine": "transformers DynamicCache", **theirs,
             "decode_of_bound": theirs["decode_tok_s"] / decode_bound, "prefill_of_bound": theirs["prefill_tok_s"] / prefill_bound}]


# ------------------------------------------------------------------------------------ llamacpp
def llama_bench(binary: str, gguf: Path, prompt: int, gen: int) -> list[dict]:
    """llama-bench's JSON rows for one GGUF at threads 1 and 2 (3 repetitions each)."""
    import subprocess

    cmd = [binary, "-m", str(gguf), "-p", str(prompt), "-n", str(gen), "-t", "1,2", "-r", "3", "-o", "json"]
    print(" ".join(cmd), flush=True)
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def part_llamacpp(book, args) -> list[dict]:
    import shape_gguf
    import torch

    from engine.models.loader import load_model
    from engine.models.source import default_gguf_path

    if not args.llama_bench or not Path(args.llama_bench).is_file():
        print("llamacpp part skipped: no llama-bench binary; give llama.cpp's llama-bench with --llama-bench PATH")
        return []
    folder = shape_folder()
    shape_q4_0 = common.WORK / "qwen2.5-1.5b-shape-q4_0.gguf"
    if not shape_q4_0.exists():
        shape_gguf.write(folder, shape_q4_0, "Q4_0")
    models = {"Qwen2.5-1.5B shape": (folder, shape_q4_0, "Q4_0 (Q8_0 embedding = head)"),
              "SmolLM2-135M (embedded)": ("default", default_gguf_path(), "Q4_1 (embedded GGUF)")}
    rows = []
    for label, (source, gguf, quant) in models.items():
        for r in llama_bench(args.llama_bench, gguf, args.llama_prompt, args.llama_gen):
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            rows.append({"model": label, "engine": f"llama.cpp {r.get('build_commit', '?')}", "weights": quant, "test": test,
                         "threads": r["n_threads"], "tok_s": r["avg_ts"], "stddev": r["stddev_ts"]})
        lm = load_model(str(source), device="cpu", weights="int4", threads=2)
        for threads in (1, 2):
            torch.set_num_threads(threads)  # the thread counts llama-bench runs
            with tempfile.TemporaryDirectory() as tmp:
                ours = trace_ours(lm, torch.tensor(book[: args.llama_prompt]), [args.llama_prompt], args.decode_steps, Path(tmp))
            rate = ours[args.llama_prompt]
            for test, key in ((f"pp{args.llama_prompt}", "prefill_tok_s"), (f"tg{args.decode_steps}", "decode_tok_s")):
                rows.append({"model": label, "engine": "ours", "weights": lm.weights_label, "test": test, "threads": threads,
                             "tok_s": rate[key], "stddev": None})
        del lm
    return rows


# ------------------------------------------------------------------------------------ lengths
def trace_ours(lm, ids, marks, decode_steps, workdir: Path) -> dict:
    import torch

    from engine.kvcache.archive import ArchiveLayout, ArchiveWriter
    from engine.models.decoder import ChunkTaps
    from engine.settings import CachePolicy, RecallSettings

    policy, recall = CachePolicy(), RecallSettings()
    dec = lm.decoder
    cache = dec.new_cache(policy, "compact")
    shape = dec.shape
    layout = ArchiveLayout(shape.num_layers, shape.kv_heads, shape.head_dim, max(marks), recall.block_tokens,
                           recall.archive_bits, policy.group_size)
    writer = ArchiveWriter(workdir / "speed-archive.safetensors", layout, dec.rope)
    out, elapsed, step = {}, 0.0, policy.chunk_tokens
    try:
        for first in range(0, max(marks), step):
            t0 = time.perf_counter()
            dec.forward(ids[first : first + step], cache, taps=ChunkTaps(archive=writer))
            last = time.perf_counter() - t0
            elapsed += last
            n = first + step
            if n in marks:
                twin, times, token = cache.fork(), [], 42
                for _ in range(decode_steps):
                    t0 = time.perf_counter()
                    logits = dec.forward(torch.tensor([token]), twin, slack_tokens=twin.decode_slack, reuse_workspace=True)
                    times.append(time.perf_counter() - t0)
                    token = int(logits[-1].argmax())
                out[n] = {"prefill_tok_s": n / elapsed, "chunk_tok_s": step / last, "decode_tok_s": 1 / common.median(times)}
                print(json.dumps({"ours": n, **out[n]}), flush=True)
    finally:
        writer.abort()
    return out


def trace_hf(lm, ids, marks, decode_steps, chunk=512) -> dict:
    out = {}
    for n, elapsed, last, times, _cache in common.hf_trace(lm, ids, marks, decode_steps, chunk):
        out[n] = {"prefill_tok_s": n / elapsed, "chunk_tok_s": chunk / last, "decode_tok_s": 1 / common.median(times)}
        print(json.dumps({"transformers": n, **out[n]}), flush=True)
    return out


def part_lengths(lm, book, args, threads) -> list[dict]:
    import torch

    step = 512
    marks = sorted({n for n in args.lengths if n <= len(book)} | ({len(book) // step * step} if args.whole_book else set()))
    ids = torch.tensor(book[: max(marks)])
    with tempfile.TemporaryDirectory() as tmp:
        ours = trace_ours(lm, ids, marks, args.decode_steps, Path(tmp))
    hf_marks = [n for n in marks if n <= 8192]
    theirs = trace_hf(lm, ids, hf_marks, args.decode_steps) if hf_marks else {}
    llama = common.llama_cpp(book, [n for n in marks if n <= 8192], args.decode_steps, threads)
    rows = []
    for n in marks:
        row = {"tokens": n, "engine": "ours", **ours[n]}
        if n in theirs:
            row["prefill_vs_transformers"] = ours[n]["prefill_tok_s"] / theirs[n]["prefill_tok_s"]
            row["decode_vs_transformers"] = ours[n]["decode_tok_s"] / theirs[n]["decode_tok_s"]
        rows.append(row)
    rows += [{"tokens": n, "engine": "transformers DynamicCache", **theirs[n]} for n in hf_marks]
    for r in llama.get("rows", []):
        rows.append({"tokens": r["tokens"], "engine": llama["version"] + " (f16 KV)", "prefill_tok_s": r["prefill_tok_s"],
                     "decode_tok_s": 1000 / r["decode_ms"]})
    if "error" in llama:
        print(f"llama.cpp: {llama['error']}")
    return rows


def plot_lengths(rows, threads) -> None:
    try:
        plt = common.pyplot()
    except ImportError as exc:  # matplotlib is not among the test tools: the results are written already
        print(f"no plot: {exc}")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for engine in sorted({r["engine"] for r in rows}):
        sub = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["tokens"])
        xs = [r["tokens"] for r in sub]
        a.plot(xs, [r["prefill_tok_s"] for r in sub], "o-", label=engine)
        b.plot(xs, [r["decode_tok_s"] for r in sub], "o-", label=engine)
    for ax, title in ((a, "prefill tokens/s (higher is better)"), (b, "decode tokens/s (higher is better)")):
        ax.set(xscale="log", title=title, xlabel="document tokens")
        ax.axvline(8192, color="grey", lw=0.8, ls=":")
    a.axhline(275, color="C3", lw=0.8, ls="--", label="target 275 tok/s")
    b.axhline(30, color="C3", lw=0.8, ls="--", label="target 30 tok/s")
    a.legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M on the CPU, {threads} thread(s), the CPU default weights (int4)", fontsize=9)
    fig.tight_layout()
    fig.savefig(common.OUT / "speed_lengths.png")


# ------------------------------------------------------------------------------------- before
# Runs inside a child process with PYTHONPATH at the checkout being measured: only APIs that every
# commit since the decoder existed has (load_model, new_cache, forward).
BEFORE_CHILD = """
import json, sys, time, statistics, torch
threads = int(sys.argv[2]); torch.set_num_threads(threads)
began = time.perf_counter()
from engine.models.loader import load_model
lm = load_model("default", device="cpu")
load_s = time.perf_counter() - began
torch.set_num_threads(threads)
from engine.settings import CachePolicy
ids = torch.tensor(json.load(open(sys.argv[1]))[:8192])
cache = lm.decoder.new_cache(CachePolicy(), "compact")
chunks = []
for first in range(0, len(ids), 512):
    t = time.perf_counter(); lm.decoder.forward(ids[first:first + 512], cache); chunks.append(time.perf_counter() - t)
steps, token = [], 42
for _ in range(16):
    t = time.perf_counter()
    logits = lm.decoder.forward(torch.tensor([token]), cache, slack_tokens=32, reuse_workspace=True)
    steps.append(time.perf_counter() - t); token = int(logits[-1].argmax())
try:  # commits since the per-machine column sums: which way the prefill summed H2O's scores
    from engine.kvcache import column_sums
    from dataclasses import asdict
    chosen = [asdict(c) for c in column_sums.measured()]
except ImportError:
    chosen = None
print(json.dumps({"model_load_s": load_s, "prefill_8k_tok_s": len(ids) / sum(chunks),
                  "chunk_tok_s": 512 / statistics.median(chunks[-4:]), "decode_tok_s": 1 / statistics.median(steps),
                  "column_sums": chosen}))
"""


def part_before(rev: str, threads: int) -> list[dict]:
    import subprocess
    import sys

    tokens = common.WORK / "thinkpython-all.json"
    child = common.WORK / "speed_before_child.py"
    child.write_text(BEFORE_CHILD)
    tree = common.WORK / f"before-{rev}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(common.REPO), "worktree", "add", "--detach", str(tree), rev], check=True)
    head = subprocess.run(["git", "-C", str(common.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for label, checkout in ((f"{rev} (before)", tree), (f"{head} (this checkout)", common.REPO)):
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        done = subprocess.run([sys.executable, str(child), str(tokens), str(threads)], capture_output=True, text=True, env=env, cwd=checkout)
        if done.returncode:
            raise RuntimeError(f"{label}: {done.stderr.strip().splitlines()[-1]}")
        rows.append({"commit": label, **json.loads(done.stdout.strip().splitlines()[-1])})
        print(json.dumps(rows[-1]), flush=True)
    # The old commit's checkout is removed again: left under bench/.work, its docs and tests would be
    # scanned as this checkout's by tests/test_docs.py.
    subprocess.run(["git", "-C", str(common.REPO), "worktree", "remove", "--force", str(tree)], check=False)
    for key in ("prefill_8k_tok_s", "chunk_tok_s", "decode_tok_s"):
        rows[1][key.replace("_tok_s", "_x")] = rows[1][key] / rows[0][key]
    return rows


# ------------------------------------------------------------------------------------- levers
def part_levers(book, rounds: int) -> list[dict]:
    import torch

    from engine.models.loader import load_model
    from engine.settings import CachePolicy
    from engine.threads import usable_cores

    ids = torch.tensor(book[:4608])
    models = {"float32 weights": load_model("default", device="cpu", weights="full"),
              "NF4 4-bit weights": load_model("default", device="cpu", weights="4bit")}

    def run(lm, threads):
        torch.set_num_threads(threads)
        cache = lm.decoder.new_cache(CachePolicy(), "compact")
        chunks = []
        for first in range(0, len(ids), 512):
            t0 = time.perf_counter()
            lm.decoder.forward(ids[first : first + 512], cache)
            chunks.append(time.perf_counter() - t0)
        steps, token = [], 42
        for _ in range(16):
            t0 = time.perf_counter()
            logits = lm.decoder.forward(torch.tensor([token]), cache, slack_tokens=32, reuse_workspace=True)
            steps.append(time.perf_counter() - t0)
            token = int(logits[-1].argmax())
        return {"prefill_tok_s": len(ids) / sum(chunks), "chunk_tok_s": 512 / chunks[-1], "decode_tok_s": 1 / common.median(steps)}

    cells = [("float32 weights", 1), ("NF4 4-bit weights", 1)]
    if usable_cores() >= 2:
        cells.append(("float32 weights", 2))
    got: dict = {}
    for rnd in range(rounds):
        for name, threads in cells:
            got.setdefault((name, threads), []).append(run(models[name], threads))
            print(json.dumps({"round": rnd, "cell": f"{name}, {threads} thread(s)", **got[(name, threads)][-1]}), flush=True)
    rows = []
    for (name, threads), runs in got.items():
        rows.append({"lever": f"{name}, {threads} thread{'s' if threads > 1 else ''}", "runs": len(runs),
                     **{k: common.median([r[k] for r in runs]) for k in ("prefill_tok_s", "chunk_tok_s", "decode_tok_s")}})
    base = rows[0]
    for row in rows:
        row["prefill_x"] = row["prefill_tok_s"] / base["prefill_tok_s"]
        row["decode_x"] = row["decode_tok_s"] / base["decode_tok_s"]
    return rows


# ------------------------------------------------------------------------------------- drafts
def part_drafts(lm, max_new_tokens: int) -> list[dict]:
    from pypdf import PdfReader, PdfWriter

    from engine.prefix_store import PrefixStore
    from engine.session import DocumentSession
    from engine.settings import EngineSettings

    p16 = common.WORK / "thinkpython-first40.pdf"
    if not p16.exists():
        writer = PdfWriter()
        for page in PdfReader(common.corpus_dir() / "pdf" / common.THINK_PYTHON).pages[:40]:
            writer.add_page(page)
        with p16.open("wb") as handle:
            writer.write(handle)
    store = PrefixStore(common.WORK / "speed-prefix-store", disk_budget_bytes=8 * 1024**3)
    rows = []
    for label, path, questions in (("P05 (18 pages)", common.corpus_dir() / "pdf" / P05, P05_QUESTIONS),
                                   ("P16 pages 1-40", p16, P16_QUESTIONS)):
        sessions = {}
        for drafts in (0, 8):
            sessions[drafts] = DocumentSession(lm, EngineSettings(max_new_tokens=max_new_tokens, draft_tokens=drafts), store)
            report = sessions[drafts].open(str(path))
        per = {0: [], 8: []}
        for q in questions:
            for drafts in (0, 8):
                a = sessions[drafts].ask(q)
                per[drafts].append(a)
                print(json.dumps({"doc": label, "drafts": drafts, "q": q, "tokens": len(a.token_ids), "decode_tok_s": a.decode_tokens_per_s,
                                  "accepted": a.drafts.accepted, "drafted": a.drafts.drafted,
                                  "recall_s": a.recall.seconds if a.recall else 0.0}), flush=True)
        same = sum(x.token_ids == y.token_ids for x, y in zip(per[0], per[8], strict=True))
        for drafts in (0, 8):
            answers = per[drafts]
            drafted = sum(a.drafts.drafted for a in answers)
            accepted = sum(a.drafts.accepted for a in answers)
            tokens = sum(len(a.token_ids) for a in answers)
            rows.append({"document": label, "document_tokens": report.document_tokens, "drafts": "on (8)" if drafts else "off",
                         "questions": len(answers), "answer_tokens": tokens,
                         "decode_tok_s": common.median([a.decode_tokens_per_s for a in answers]),
                         "ttft_s": common.median([a.time_to_first_token_s for a in answers]),
                         "recall_s_per_answer": common.median([a.recall.seconds if a.recall else 0.0 for a in answers]),
                         "acceptance": accepted / drafted if drafted else float("nan"),
                         "passes_saved": accepted / tokens if tokens else 0.0,
                         "same_tokens": f"{same}/{len(answers)}"})
    return rows


def column_sums_chosen() -> list[dict]:
    """How the fused prefill summed H2O's scores in this process (`column_sums.METHOD` and what "auto" measured)."""
    from dataclasses import asdict

    from engine.kvcache import column_sums

    return [{"method_setting": column_sums.METHOD, **asdict(choice)} for choice in column_sums.measured()]


def key_layouts_chosen() -> list[dict]:
    """How decode workspaces held their bfloat16 keys in this process (`key_layout.METHOD` and what "auto" measured)."""
    from dataclasses import asdict

    from engine.kvcache import key_layout

    return [{"method_setting": key_layout.METHOD, **asdict(choice)} for choice in key_layout.measured()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="*", default=["lengths", "levers", "drafts"], choices=["lengths", "levers", "drafts", "before", "shape", "llamacpp"])
    ap.add_argument("--before", default="77a8516", help="commit the 'before' part compares this checkout with")
    ap.add_argument("--lengths", type=int, nargs="*", default=[2048, 4096, 8192, 32768])
    ap.add_argument("--no-whole-book", dest="whole_book", action="store_false", help="stop at the longest --lengths")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--shape-tokens", type=int, default=4096, help="tokens read in the shape part (a multiple of 512)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the levers part")
    ap.add_argument("--runs", type=int, default=1, help="whole runs of the lengths part, one after another")
    ap.add_argument("--name", default="speed_lengths", help="result name of the lengths part (docs/bench/NAME.*)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="answer length in the drafts part")
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary (the llamacpp part)")
    ap.add_argument("--llama-prompt", type=int, default=512, help="tokens read in the llamacpp part (a multiple of 512)")
    ap.add_argument("--llama-gen", type=int, default=128, help="llama-bench's generated tokens in the llamacpp part")
    ap.add_argument("--threads", type=int, default=0, help="0 = the engine's choice (idle cores, measured)")
    args = ap.parse_args()
    from engine.threads import choose_threads

    threads = choose_threads(args.threads)
    common.setup(threads)
    began = time.perf_counter()
    meta = {**common.machine_info(), "threads": threads, "load_avg_start": load_avg()}
    from engine.models.loader import load_model

    lm = load_model("default", device="cpu", weights="auto", threads=threads)
    book = common.book_token_ids(lm.tokenizer)
    if "shape" in args.parts:
        rows = part_shape(book, args, threads)
        meta["load_avg_end"] = load_avg()
        meta["column_sums"] = column_sums_chosen()
        meta["key_layout"] = key_layouts_chosen()
        common.write_results("speed_shape", rows, ["engine", "tokens", "prefill_tok_s", "decode_tok_s", "prefill_vs_transformers",
                                                   "decode_vs_transformers", "weight_bytes", "decode_read_bytes", "peak_rss_bytes",
                                                   "bandwidth_gb_s", "matmul_gflop_s", "decode_bound_tok_s",
                                                   "decode_of_bound", "prefill_bound_tok_s", "prefill_of_bound"], meta)
    if "llamacpp" in args.parts:
        rows = part_llamacpp(book, args)
        meta["load_avg_end"] = load_avg()
        if rows:
            common.write_results("speed_llamacpp", rows, ["model", "engine", "weights", "test", "threads", "tok_s", "stddev"], meta)
    if "lengths" in args.parts:
        rows, loads = [], []
        for run in range(1, args.runs + 1):  # whole runs one after another: the ratio is judged in each
            rows += [{"run": run, **row} for row in part_lengths(lm, book, args, threads)]
            loads.append(load_avg())
        meta["load_avg_end"] = " | ".join(loads)
        meta["column_sums"] = column_sums_chosen()
        meta["key_layout"] = key_layouts_chosen()
        common.write_results(args.name, rows, ["run", "engine", "tokens", "prefill_tok_s", "chunk_tok_s", "decode_tok_s",
                                                     "prefill_vs_transformers", "decode_vs_transformers"], meta)
        plot_lengths([r for r in rows if r["run"] == 1], threads)  # after the results: a missing matplotlib loses only the plot
    if "levers" in args.parts:
        rows = part_levers(book, args.rounds)
        meta["load_avg_end"] = load_avg()
        common.write_results("speed_levers", rows, ["lever", "runs", "prefill_tok_s", "chunk_tok_s", "decode_tok_s",
                                                    "prefill_x", "decode_x"], meta)
    if "drafts" in args.parts:
        import torch

        torch.set_num_threads(threads)
        rows = part_drafts(lm, args.max_new_tokens)
        meta["load_avg_end"] = load_avg()
        common.write_results("speed_drafts", rows, ["document", "document_tokens", "drafts", "questions", "answer_tokens",
                                                    "decode_tok_s", "ttft_s", "recall_s_per_answer", "acceptance",
                                                    "passes_saved", "same_tokens"], meta)
    if "before" in args.parts:
        rows = part_before(args.before, threads)
        meta["load_avg_end"] = load_avg()
        common.write_results("speed_before", rows, ["commit", "model_load_s", "prefill_8k_tok_s", "chunk_tok_s", "decode_tok_s",
                                                    "prefill_8k_x", "chunk_x", "decode_x"], meta)
    print(f"speed: {time.perf_counter() - began:.0f} s, threads {threads}, load {load_avg()}")


if __name__ == "__main__":
    main()
