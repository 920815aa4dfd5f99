"""A prefill chunk's attention on the fused path (flash kernel + exact H2O scores from its log-sum-exp),
against the code before it (every probability materialised in float32); or one heavy-hitter score
against another with the current code (`--scores window mean`: SnapKV's observation window against
the default, docs/BENCHMARKS.md section 2f).

    python bench/prefill_attention.py --against f10faed                 # quality and speed, ~12 min alone
    python bench/prefill_attention.py --against f10faed --parts speed   # speed only
    python bench/prefill_attention.py --scores window mean --parts quality speed micro

`--against` names a commit whose `engine/kvcache/attention.py` (`chunk_attention`: every probability
of a chunk materialised in float32) runs in the same process as the current one, the rest of the
engine being current. Both run the same model and weights. `--scores A B` instead runs the current
code twice, with `CachePolicy.heavy_hitter_score` A and then B (B is the reference of the ratios). `--columns` runs the current code with the fused path's H2O column sums
as blocked matmuls (`column_sums.METHOD = "blocked"`) against the flash kernel's.

quality  The continuation probe of `bench/kv_quality.py` (section 2b): `--context` tokens of Think
         Python prefilled with H2O at 50 / 75 / 90 % dropped (INT4, window budget/4, original
         positions), then the next `--cont-tokens` tokens scored teacher-forced against transformers'
         full `DynamicCache` with the same weights: KL(full || ours), top-1 agreement, NLL. For each
         weight format in `--weights`: "int4" (the CPU default: bfloat16 attention, the fused path,
         where the CPU has AVX-512 BF16) and "full" (float32: the same path as before, a check).
speed    `--tokens` tokens of Think Python through the default policy (budget 4,096, compact
         positions), old and new code alternating run by run, `--runs` each: tokens/s over the whole
         prefill and over the chunks at a full budget, with the CPU default weights.
micro    (with --scores) one layer's `chunk_attention` of a 512-token chunk over 4,608 keys (a full
         budget), SmolLM2's shape (3 KV heads, group 3, head dim 64), random tensors: H2O's exact
         scores against the observation window, float32 and the bfloat16 fused path, alternating,
         median ms of `--reps` each; a shared machine slows both alike, so the ratio is the number.

Writes docs/bench/prefill_attention_{quality,speed,micro}[_scores].{json,csv} (machine, commit, load average).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def old_chunk_attention(rev: str):
    """`chunk_attention` from engine/kvcache/attention.py as of `rev` (taking and ignoring attention_dtype)."""
    module = common.module_at(rev, "engine/kvcache/attention.py")

    def chunk_attention(*args, attention_dtype=None, **kwargs):
        return module.chunk_attention(*args, **kwargs)

    return chunk_attention


class Codes:
    """The two contenders: the current and an old `engine.kvcache.cache.chunk_attention` (`rev`), or
    the current code with two heavy-hitter scores (`scores`: the first is measured, the second the
    reference). `functions` names them in that order; `use` switches the code, `policy` the score."""

    def __init__(self, rev: str | None, scores: list[str] | None = None, columns: bool = False) -> None:
        from engine.kvcache import cache, column_sums

        self.cache, self.column_sums = cache, column_sums
        self.current = cache.chunk_attention
        self.scores = scores
        self.columns = columns
        if columns:  # the fused path's H2O column sums: blocked matmuls (measured) against the flash kernel
            self.functions = {"blocked": cache.chunk_attention, "flash": cache.chunk_attention}
        elif scores:
            self.functions = {score: cache.chunk_attention for score in scores}
        else:
            self.functions = {"now": cache.chunk_attention, rev: old_chunk_attention(rev)}

    def use(self, code: str) -> None:
        self.cache.chunk_attention = self.functions[code]
        self.column_sums.METHOD = code if self.columns else "auto"

    def reset(self) -> None:
        """The current code again (after a comparison)."""
        self.cache.chunk_attention = self.current
        self.column_sums.METHOD = "auto"

    def policy(self, code: str, policy):
        """`policy` with this contender's heavy-hitter score (unchanged when comparing code)."""
        return policy.replace(heavy_hitter_score=code) if self.scores else policy

    def suffix(self) -> str:
        """Appended to the result files' names: "_scores" when comparing scores."""
        return "_columns" if self.columns else "_scores" if self.scores else ""


def quality(args, codes: Codes, meta: dict) -> None:
    import torch
    from transformers import DynamicCache

    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    rows = []
    for weights in args.weights:
        lm = load_model("default", device="cpu", weights=weights, threads=args.threads)
        book = common.book_token_ids(lm.tokenizer)
        step = (len(book) - args.context - args.cont_tokens) // args.samples
        for s in range(args.samples):
            first = 5000 + s * step
            ctx = book[first : first + args.context]
            cont = book[first + args.context : first + args.context + args.cont_tokens]
            with torch.inference_mode():
                full = DynamicCache()
                lm.decoder.model(torch.tensor([ctx]), past_key_values=full, logits_to_keep=1)
                ref = lm.decoder.model(torch.tensor([cont]), past_key_values=full).logits[0].float()
            for ratio in args.ratios:
                budget = round(args.context * (1 - ratio))
                window = max(budget // 4, 16)
                policy = CachePolicy(budget_tokens=budget, window_tokens=window, residual_tokens=min(128, window), kv_bits=4)
                for code in codes.functions:
                    codes.use(code)
                    cache = lm.decoder.new_cache(codes.policy(code, policy), "original")
                    lm.decoder.prefill(torch.tensor(ctx), cache)
                    logits = lm.decoder.forward(torch.tensor(cont), cache, all_logits=True, slack_tokens=len(cont))
                    metrics = common.logit_metrics(ref[:-1], logits[:-1], torch.tensor(cont[1:]))
                    row = {"weights": lm.weights_label, "attention": str(lm.decoder.attention_dtype).removeprefix("torch."),
                           "code": code, "dropped": ratio, "sample": s, **metrics}
                    rows.append(row)
                    print(row, flush=True)
    codes.reset()
    summary = []
    for weights in dict.fromkeys(r["weights"] for r in rows):
        for ratio in args.ratios:
            cell = {code: [r for r in rows if r["weights"] == weights and r["dropped"] == ratio and r["code"] == code]
                    for code in codes.functions}
            for code, runs in cell.items():
                summary.append({"weights": weights, "attention": runs[0]["attention"] if code == "now" or codes.scores or codes.columns else "float32 (old)",
                                "code": code, "dropped": f"{ratio:.0%}", "samples": len(runs),
                                "kl": sum(r["kl"] for r in runs) / len(runs), "agree": sum(r["agree"] for r in runs) / len(runs),
                                "delta_nll": sum(r["nll"] - r["ref_nll"] for r in runs) / len(runs)})
            old, new = (summary[-len(cell) + i] for i in (1, 0))
            new["kl_vs_old"] = round(new["kl"] / old["kl"], 3)
    meta.update(context=args.context, cont_tokens=args.cont_tokens, load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    common.write_results("prefill_attention_quality" + codes.suffix(), summary,
                         ["weights", "attention", "code", "dropped", "samples", "kl", "agree", "delta_nll", "kl_vs_old"], meta)


def speed(args, codes: Codes, meta: dict) -> None:
    import torch

    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    lm = load_model("default", device="cpu", weights="auto", threads=args.threads)
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[: args.tokens])
    policy = CachePolicy(position_mode="compact")
    samples = {code: {"prefill": [], "full_budget": []} for code in codes.functions}
    for i in range(args.runs):
        for code in list(codes.functions) if i % 2 == 0 else list(codes.functions)[::-1]:
            codes.use(code)
            marks = []
            cache = lm.decoder.new_cache(codes.policy(code, policy), "compact")
            began = time.perf_counter()
            lm.decoder.prefill(ids, cache, progress=lambda done, total, s: marks.append((done, s)))
            total = time.perf_counter() - began
            full = [(d, s) for d, s in marks if d > policy.budget_tokens + policy.chunk_tokens]
            samples[code]["prefill"].append(len(ids) / total)
            samples[code]["full_budget"].append((full[-1][0] - full[0][0]) / (full[-1][1] - full[0][1]))
            print(f"run {i} {code}: {samples[code]['prefill'][-1]:.0f} tok/s, "
                  f"at a full budget {samples[code]['full_budget'][-1]:.0f}", flush=True)
    codes.reset()
    rows = [{"code": code, "weights": lm.weights_label, "threads": torch.get_num_threads(), "tokens": len(ids), "runs": args.runs,
             "prefill_tok_s": round(common.median(s["prefill"]), 1), "full_budget_tok_s": round(common.median(s["full_budget"]), 1)}
            for code, s in samples.items()]
    old = rows[1]
    for row in rows:
        row["speedup"] = round(row["full_budget_tok_s"] / old["full_budget_tok_s"], 2)
    meta.update(load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    common.write_results("prefill_attention_speed" + codes.suffix(), rows,
                         ["code", "weights", "threads", "tokens", "runs", "prefill_tok_s", "full_budget_tok_s", "speedup"], meta)


def micro(args, meta: dict) -> None:
    import torch

    from engine.kvcache.attention import SNAP_WINDOW_QUERIES, chunk_attention

    torch.manual_seed(0)
    kv_heads, group, chunk, head_dim, held = 3, 3, 512, 64, 4096
    query = torch.randn(kv_heads, group, chunk, head_dim)
    keys = (torch.randn(kv_heads, held, head_dim), torch.randn(kv_heads, chunk, head_dim))
    values = (torch.randn(kv_heads, held, head_dim), torch.randn(kv_heads, chunk, head_dim))
    paths = {(dtype, scoring): [] for dtype in (None, torch.bfloat16) for scoring in ("sum", "window")}
    for rep in range(args.reps + 1):  # the first round warms the kernels and the allocator up
        for dtype, scoring in paths if rep % 2 == 0 else list(paths)[::-1]:
            began = time.perf_counter()
            chunk_attention(query, keys, values, scaling=head_dim**-0.5, masks=(None, None), attention_dtype=dtype,
                            scoring=scoring)
            if rep:
                paths[(dtype, scoring)].append(1000 * (time.perf_counter() - began))
    rows = []
    for (dtype, scoring), times in paths.items():
        rows.append({"attention": "bfloat16 (fused)" if dtype else "float32",
                     "scores": f"window {SNAP_WINDOW_QUERIES}" if scoring == "window" else "H2O (all queries)",
                     "threads": torch.get_num_threads(), "reps": args.reps, "median_ms": round(common.median(times), 1)})
    for row in rows:
        same = next(r for r in rows if r["attention"] == row["attention"] and r["scores"].startswith("H2O"))
        row["vs_h2o"] = round(row["median_ms"] / same["median_ms"], 2)
    meta.update(load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    common.write_results("prefill_attention_micro", rows, ["attention", "scores", "threads", "reps", "median_ms", "vs_h2o"], meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="the commit whose chunk_attention runs side by side")
    parser.add_argument("--scores", nargs=2, choices=["sum", "mean", "window"],
                        help="instead of --against: the current code with these two heavy-hitter scores (measured, reference)")
    parser.add_argument("--columns", action="store_true",
                        help="instead of --against: the fused path's H2O column sums, blocked matmuls against the flash kernel")
    parser.add_argument("--parts", nargs="+", default=["quality", "speed"], choices=["quality", "speed", "micro"])
    parser.add_argument("--reps", type=int, default=7, help="micro: timed calls per path")
    parser.add_argument("--threads", type=int, default=2, help="run alone on the cores at 2 (bench/common.py)")
    parser.add_argument("--weights", nargs="+", default=["int4"])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--cont-tokens", type=int, default=256)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if bool(args.against) + bool(args.scores) + args.columns != 1:
        parser.error("give one of --against, --scores or --columns")
    common.setup(args.threads)
    codes = Codes(args.against, args.scores, args.columns)
    against = {"against": args.against} if args.against else {"scores": args.scores} if args.scores else {"columns": True}
    if "quality" in args.parts:
        quality(args, codes, {**common.machine_info(), **against})
    if "speed" in args.parts:
        speed(args, codes, {**common.machine_info(), **against})
    if "micro" in args.parts:
        micro(args, {**common.machine_info(), **against})


if __name__ == "__main__":
    main()
