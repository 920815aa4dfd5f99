"""Answer quality of the compressed KV cache vs. a full cache and vs. kvpress, on SmolLM2-135M.

    python bench/kv_quality.py --parts passkey continuation stream long   # our rows (resumable)
    python bench/kv_quality.py --parts kvpress                             # kvpress rows (its own venv)
    python bench/kv_quality.py --report                                    # tables + plots -> docs/bench

Three probes, all greedy and with the model's float32 weights (kvpress gets the same safetensors):
  passkey       a 5-digit key in filler text at depths 10-90 %; hit = the key appears in 8 greedy tokens
  continuation  4,096 tokens of Think Python as context (compressed), then 256 tokens scored
                teacher-forced: NLL, KL(full || method) and top-1 agreement vs. a full cache
  stream        Think Python streamed through the cache in 512-token chunks (StreamingLLM-style
                perplexity), to 32k tokens by default, far past the model's 8,192 positions
  long          passkey at 16k / 32k tokens with the default policy in compact positions
A compression ratio r keeps budget = round((1 - r) * context) tokens (kvpress: compression_ratio=r).
Each finished row is appended to bench/.work/quality-*.jsonl; rerunning skips what is done.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

import common

EOS_SLACK = 32  # like DocumentSession: question and answer tokens never trigger an eviction


def our_configs(n: int, ratio: float | None) -> dict:
    """name -> (CachePolicy, position mode) for a context of n tokens at compression ratio r."""
    from engine.settings import CachePolicy

    if ratio is None:  # no eviction
        big = n + 1024
        return {
            "full-fp16": (CachePolicy(budget_tokens=big, window_tokens=1024, kv_bits=16), "original"),
            "int4-only": (CachePolicy(budget_tokens=big, window_tokens=1024, kv_bits=4), "original"),
        }
    budget = round(n * (1 - ratio))
    window = max(budget // 4, 16)  # the app's default ratio: window 1024 of budget 4096
    residual = min(128, window)
    policy = CachePolicy(budget_tokens=budget, window_tokens=window, residual_tokens=residual, kv_bits=4)
    stream = policy.replace(window_tokens=budget - 4, kv_bits=16)
    return {
        "streaming-fp16": (stream, "original"),
        "h2o-fp16": (policy.replace(kv_bits=16), "original"),
        "h2o-int4": (policy, "original"),
        "h2o-int4-mean": (policy.replace(heavy_hitter_score="mean"), "original"),
        "h2o-int4-sum": (policy.replace(heavy_hitter_score="sum"), "original"),
        "h2o-int4-window": (policy.replace(heavy_hitter_score="window"), "original"),  # SnapKV's window, section 2f
        "h2o-int4-compact": (policy, "compact"),
    }


class Log:
    """Append-only jsonl of finished rows, keyed, so an interrupted run resumes."""

    def __init__(self, part: str) -> None:
        self.path = common.WORK / f"quality-{part}.jsonl"
        self.rows = [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []
        self.done = {row["key"] for row in self.rows}

    def add(self, row: dict) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        self.rows.append(row)
        self.done.add(row["key"])
        print(json.dumps({k: v for k, v in row.items() if k != "generated"}), flush=True)


def generate(lm, cache, question: list[int], steps: int, eos: set[int]) -> list[int]:
    import torch

    logits = lm.decoder.forward(torch.tensor(question), cache, slack_tokens=EOS_SLACK)
    out = []
    for _ in range(steps):
        out.append(int(logits[-1].argmax()))
        if out[-1] in eos:
            break
        logits = lm.decoder.forward(torch.tensor([out[-1]]), cache, slack_tokens=EOS_SLACK)
    return out


def run_passkey(lm, args, log: Log, grid: list[tuple[int, float]], configs_for, part: str) -> None:
    import torch

    eos = {lm.tokenizer.eos_token_id, *lm.tokenizer.convert_tokens_to_ids(["<|im_end|>"])}
    for n, ratio in grid:
        depths = args.depths if n <= 4096 else args.depths_8k if n <= 8192 else args.long_depths
        for trial in common.passkey_trials([n], depths, args.keys):
            ctx, question = common.passkey_prompt(lm.tokenizer, n, trial["depth"], trial["key"])
            for name, (policy, mode) in configs_for(n, ratio).items():
                if name in args.passkey_skip:
                    continue
                key = f"{part}|{name}|{ratio}|{n}|{trial['depth']}|{trial['key']}"
                if key in log.done:
                    continue
                cache = lm.decoder.new_cache(policy, mode)
                began = time.perf_counter()
                lm.decoder.prefill(torch.tensor(ctx), cache)
                prefill_s = time.perf_counter() - began
                kept = cache.n_tokens
                cache.shrink()
                gen = generate(lm, cache, question, 8, eos)
                hit = str(trial["key"]) in lm.tokenizer.decode(gen)
                log.add({"key": key, "method": name, "ratio": ratio or 0.0, "length": n, "depth": trial["depth"],
                         "hit": hit, "kept_tokens": kept, "prefill_s": prefill_s, "kv_bytes": cache.memory().total_bytes,
                         "answer": lm.tokenizer.decode(gen)})


def continuation_samples(tokenizer, args) -> list[tuple[str, list[int], list[int]]]:
    book = common.book_token_ids(tokenizer)
    step = (len(book) - args.context - args.cont_tokens) // args.samples
    return [(f"s{i}", book[i * step + 5000 : i * step + 5000 + args.context],
             book[i * step + 5000 + args.context : i * step + 5000 + args.context + args.cont_tokens])
            for i in range(args.samples)]


def run_continuation(lm, args, log: Log) -> None:
    import torch
    from transformers import DynamicCache

    model = lm.decoder.model
    for sid, ctx, cont in continuation_samples(lm.tokenizer, args):
        with torch.inference_mode():  # reference: transformers' full DynamicCache, same weights
            cache = DynamicCache()
            model(torch.tensor([ctx]), past_key_values=cache, logits_to_keep=1)
            ref = model(torch.tensor([cont]), past_key_values=cache).logits[0].float()
        runs = [(None, our_configs(args.context, None))] + [(r, our_configs(args.context, r)) for r in args.ratios]
        for ratio, configs in runs:
            for name, (policy, mode) in configs.items():
                key = f"cont|{name}|{ratio}|{sid}"
                if key in log.done or (args.methods and name not in args.methods):
                    continue
                cache = lm.decoder.new_cache(policy, mode)
                lm.decoder.prefill(torch.tensor(ctx), cache)
                kept = cache.n_tokens
                logits = lm.decoder.forward(torch.tensor(cont), cache, all_logits=True, slack_tokens=len(cont))
                metrics = common.logit_metrics(ref[:-1], logits[:-1], torch.tensor(cont[1:]))
                log.add({"key": key, "method": name, "ratio": ratio or 0.0, "sample": sid, "kept_tokens": kept, **metrics})


def run_stream(lm, args, log: Log) -> None:
    """Per-token NLL while streaming the book; reference: full cache on the first 8,192 tokens."""
    import torch
    from transformers import DynamicCache

    from engine.settings import CachePolicy

    book = common.book_token_ids(lm.tokenizer)[: args.stream_tokens]
    default = CachePolicy()
    runs = {
        "h2o-int4-compact (default policy)": (default, "compact", len(book)),
        "streaming-fp16-compact": (default.replace(window_tokens=default.budget_tokens - 4, kv_bits=16), "compact", len(book)),
    }
    if args.stream_original:
        runs["h2o-int4-original (≤8k)"] = (default, "original", 8192)
    if "stream|full" not in log.done:
        nll = []
        with torch.inference_mode():
            cache = DynamicCache()
            for first in range(0, min(8192, len(book)) - 1, 512):
                chunk = torch.tensor([book[first : min(first + 513, 8192)]])
                logits = lm.decoder.model(chunk[:, :-1], past_key_values=cache).logits[0].float()
                nll += (-torch.log_softmax(logits, -1).gather(1, chunk[0, 1:, None])[:, 0]).tolist()
        log.add({"key": "stream|full", "method": "full (transformers DynamicCache, ≤8k)", "nll": nll})
    for name, (policy, mode, limit) in runs.items():
        if f"stream|{name}" in log.done:
            continue
        cache, nll, began = lm.decoder.new_cache(policy, mode), [], time.perf_counter()
        limit = min(limit, len(book))
        for first in range(0, limit - 1, policy.chunk_tokens):
            chunk = torch.tensor(book[first : min(first + policy.chunk_tokens + 1, limit)])
            logits = lm.decoder.forward(chunk[:-1], cache, all_logits=True)
            nll += (-torch.log_softmax(logits[: len(chunk) - 1], -1).gather(1, chunk[1:, None])[:, 0]).tolist()
        log.add({"key": f"stream|{name}", "method": name, "nll": nll, "seconds": time.perf_counter() - began})


def run_kvpress(lm, args) -> None:
    """Write the same prompts as token ids, run bench/kvpress_runner.py in its own venv."""
    if not common.KVPRESS_PYTHON.exists():
        raise SystemExit(f"{common.KVPRESS_PYTHON} missing: see bench/README.md (kvpress venv)")
    passkey = []
    for n, ratios in _passkey_ratios(args).items():
        depths = args.depths if n <= 4096 else args.depths_8k
        for t in common.passkey_trials([n], depths, args.keys):
            ctx, q = common.passkey_prompt(lm.tokenizer, n, t["depth"], t["key"])
            passkey.append({"id": f"{n}|{t['depth']}|{t['key']}", "context": ctx, "question": q, "max_new_tokens": 8, "ratios": ratios})
    cont = [{"id": sid, "context": c, "continuation": x, "ratios": args.ratios} for sid, c, x in continuation_samples(lm.tokenizer, args)]
    tasks = {"model_dir": str(common.hf_folder()), "threads": args.threads, "passkey": passkey, "continuation": cont,
             "presses": ["streaming_llm", "snapkv", "observed_attention", "expected_attention"],
             "passkey_presses": ["none", *args.kvpress_passkey]}
    path = common.WORK / "kvpress-tasks.json"
    path.write_text(json.dumps(tasks))
    began = time.perf_counter()
    subprocess.run([str(common.KVPRESS_PYTHON), str(common.BENCH / "kvpress_runner.py"), str(path),
                    str(common.WORK / "kvpress-results.json")], check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": str(args.threads)})
    print(f"kvpress runner: {time.perf_counter() - began:.0f} s")


def _passkey_ratios(args) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for n in args.lengths:
        out[n] = [args.passkey_ratio] + ([r for r in args.ratios if r != args.passkey_ratio] if n == args.sweep_length else [])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="*", default=["passkey", "continuation", "stream", "long"],
                    choices=["passkey", "continuation", "stream", "long", "kvpress"])
    ap.add_argument("--report", action="store_true", help="only build tables and plots from finished rows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="*", default=[2048, 4096, 8192])
    ap.add_argument("--depths", type=float, nargs="*", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--depths-8k", type=float, nargs="*", default=[0.1, 0.5, 0.9])
    ap.add_argument("--keys", type=int, default=1, help="keys per (length, depth) cell")
    ap.add_argument("--passkey-ratio", type=float, default=0.75, help="ratio used at every length")
    ap.add_argument("--sweep-length", type=int, default=4096, help="length at which all --ratios are run")
    ap.add_argument("--passkey-skip", nargs="*", default=["h2o-fp16"], help="our configs left out of the passkey grid (time)")
    ap.add_argument("--ratios", type=float, nargs="*", default=[0.5, 0.75, 0.9])
    ap.add_argument("--kvpress-passkey", nargs="*", default=["streaming_llm", "snapkv", "observed_attention", "expected_attention"],
                    help="presses that also run the passkey grid (all run the continuation)")
    ap.add_argument("--long-lengths", type=int, nargs="*", default=[16384, 32768])
    ap.add_argument("--long-depths", type=float, nargs="*", default=[0.1, 0.5, 0.9])
    ap.add_argument("--methods", nargs="*", default=[], help="continuation: only these of our configs (default all)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--cont-tokens", type=int, default=256)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--stream-tokens", type=int, default=32768)
    ap.add_argument("--stream-original", action="store_true", help="also stream the first 8k in original positions")
    args = ap.parse_args()
    common.setup(args.threads)
    if args.report:
        import quality_report

        quality_report.report()
        return
    lm = common.load_lm()
    began = time.perf_counter()
    for part in args.parts:
        if part == "passkey":
            grid = [(n, r) for n, rs in _passkey_ratios(args).items() for r in rs]
            base = [(n, None) for n in args.lengths]
            run_passkey(lm, args, Log("passkey"), base + grid, our_configs, "pk")
        elif part == "long":
            from engine.settings import CachePolicy

            cfg = lambda n, r: {"h2o-int4-compact (default policy)": (CachePolicy(), "compact")}  # noqa: E731
            run_passkey(lm, args, Log("long"), [(n, None) for n in args.long_lengths], cfg, "long")
        elif part == "continuation":
            run_continuation(lm, args, Log("continuation"))
        elif part == "stream":
            run_stream(lm, args, Log("stream"))
        elif part == "kvpress":
            run_kvpress(lm, args)
    print(f"kv_quality {' '.join(args.parts)}: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
