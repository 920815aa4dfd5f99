"""What one decode step over a full 4,096-token snapshot costs: the compressed cache's decode path.

    python bench/decode_step.py                      # 1 and 2 threads, ~3 min on idle cores
    python bench/decode_step.py --against 7bd63e0    # also that commit's cache.py, side by side
    python bench/decode_step.py --parts quality      # what the CPU's decode workspace costs in answers

The snapshot: the first `--tokens` tokens of P05 (`engine.documents.load_document`) prefilled with
the default policy (budget 4,096, INT4 keys/values, 128-token residual) in `--mode` positions
("compact", what a book past the model's 8,192 positions gets; "original" for a shorter one), the
CPU's default weights (`weights = "auto"`), recall off. Each run clones the snapshot, as every
question does, and decodes `--steps` tokens of the document's continuation one at a time as
`DocumentSession` does (`reuse_workspace=True`, its eviction slack `decode_eviction_slack`):
so a run includes the workspace's first build, its flushes (every 32 tokens) and evictions (every
slack + 1 tokens). Thread counts (and,
with `--against`, the old and the current cache code) are interleaved run by run in one process;
medians of `--runs` runs. `ms_per_step` is the run's mean (what an answer sees), `steady_ms` the
median single step. With `--against` the logits of both are compared at every step.

quality: the decode path of the CPU's default (`Bf16Int8Workspace`: bfloat16 keys, int8 values,
where the weights are int4 on AVX-512 BF16; without it an `Int8Workspace` and the LM head's int8
step copy) against a float32 workspace and the int4 kernel over the same snapshots
(the first 4,200 / 5,000 / 6,000 tokens of P05, compact positions), 96 teacher-forced steps of the
document's continuation each: KL(float32 ‖ default) of the next-token distribution, top-1
agreement, and the NLL of the true next token for both.

Writes docs/bench/decode_step.{json,csv} (speed) and docs/bench/decode_quality.{json,csv}, with the
machine and the load average at start and end.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=6000, help="document tokens prefilled into the snapshot")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per run")
    parser.add_argument("--runs", type=int, default=10, help="runs per code and thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--mode", default="compact", choices=["compact", "original"])
    parser.add_argument("--against", default=None, help="a commit whose cache.py runs side by side")
    parser.add_argument("--parts", nargs="+", default=["speed"], choices=["speed", "quality"])
    args = parser.parse_args()
    common.setup(1)
    import torch

    import engine.kvcache.cache as current

    from engine.documents import load_document
    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    meta = common.machine_info()
    lm = load_model("default", device="cpu", weights="auto", threads=1)
    decoder = lm.decoder
    doc = load_document(common.corpus_dir() / "pdf" / "P05_dmca.pdf")
    ids = lm.tokenizer("\n\n".join(s.text for s in doc.segments), add_special_tokens=False)["input_ids"]
    if len(ids) < args.tokens + args.steps:
        raise SystemExit(f"P05 has {len(ids)} tokens, fewer than --tokens + --steps")
    policy = CachePolicy(position_mode=args.mode)
    slack = current.decode_eviction_slack(policy.budget_tokens)
    snapshot = decoder.new_cache(policy, args.mode)
    began = time.perf_counter()
    decoder.prefill(torch.tensor(ids[: args.tokens]), snapshot)
    snapshot.shrink()
    print(f"snapshot: {snapshot.n_tokens} held of {args.tokens} in {time.perf_counter() - began:.1f} s", flush=True)
    if "quality" in args.parts:
        quality(lm, ids, policy, args, dict(meta))
    if "speed" not in args.parts:
        return
    codes = {"current": snapshot}
    if args.against:
        old = common.module_at(args.against, "engine/kvcache/cache.py")
        tensors, cache_meta = snapshot.export()
        codes[args.against] = old.CompressedCache.restore(tensors, cache_meta, shape=decoder.shape, policy=policy,
                                                          device=decoder.device, store_dtype=decoder.store_dtype)
    feed = ids[args.tokens : args.tokens + args.steps]

    def run(cache) -> tuple[list[float], list[torch.Tensor]]:
        cache = cache.fork() if hasattr(cache, "fork") else cache.clone()  # an older commit's cache clones
        seconds, logits = [], []
        for token in feed:
            start = time.perf_counter()
            logits.append(decoder.forward(torch.tensor([token]), cache, slack_tokens=slack, reuse_workspace=True))
            seconds.append(time.perf_counter() - start)
        return seconds, logits

    samples = {(code, t): {"mean": [], "steady": []} for code in codes for t in args.threads}
    same = True
    for i in range(args.runs):
        for threads in args.threads if i % 2 == 0 else args.threads[::-1]:
            torch.set_num_threads(threads)
            outputs = {}
            for code in list(codes) if i % 2 == 0 else list(codes)[::-1]:
                seconds, outputs[code] = run(codes[code])
                samples[code, threads]["mean"].append(1000 * sum(seconds) / len(seconds))
                samples[code, threads]["steady"].append(1000 * common.median(seconds))
            if args.against:
                same &= all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True))
            print(f"run {i} threads {threads}: " + ", ".join(
                f"{code} {samples[code, threads]['mean'][-1]:.1f} ms" for code in codes), flush=True)
    torch.set_num_threads(1)
    rows = []
    for (code, threads), s in samples.items():
        ms = common.median(s["mean"])
        rows.append({"code": code, "threads": threads, "mode": args.mode, "held_tokens": snapshot.n_tokens,
                     "runs": len(s["mean"]), "steps": args.steps, "ms_per_step": round(ms, 2),
                     "steady_ms": round(common.median(s["steady"]), 2), "tok_s": round(1000 / ms, 2)})
    if args.against:
        for row in rows:
            base = next(r for r in rows if r["code"] == args.against and r["threads"] == row["threads"])
            row["speedup"] = round(base["ms_per_step"] / row["ms_per_step"], 2)
        meta["same_logits"] = same
    meta.update(weights=lm.weights_label, document="P05", document_tokens=args.tokens,
                load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    columns = ["code", "threads", "mode", "held_tokens", "runs", "steps", "ms_per_step", "steady_ms", "tok_s"]
    common.write_results("decode_step", rows, columns + (["speedup"] if args.against else []), meta)


def quality(lm, ids: list[int], policy, args, meta: dict) -> None:
    """KL, top-1 agreement and NLL of the default decode path against a float32 workspace (module docstring)."""
    import torch

    from engine.kvcache.cache import decode_eviction_slack
    from engine.models.decoder import CompressedDecoder
    from engine.models.int4_cpu import Int4Linear

    torch.set_num_threads(args.threads[-1])
    slack = decode_eviction_slack(policy.budget_tokens)
    decoder = lm.decoder
    # float32 attention and workspace, and every weight through its int4 (or float) layer: no int8
    # step copy of the LM head (without AVX-512 BF16 the default decodes on it and an `Int8Workspace`)
    plain = copy.deepcopy(decoder.model)
    for module in plain.modules():
        if isinstance(module, Int4Linear):
            module.step_codes = module.step_scales = None
    reference = CompressedDecoder(plain, attention_dtype=None)
    rows, steps = [], 96
    for context in (4200, 5000, 6000):
        snapshot = decoder.new_cache(policy, args.mode)
        decoder.prefill(torch.tensor(ids[:context]), snapshot)
        ours, theirs = snapshot.fork(), snapshot.fork()
        kl = agree = nll_ours = nll_ref = 0.0
        for i in range(steps):
            token, following = ids[context + i], ids[context + i + 1]
            a = decoder.forward(torch.tensor([token]), ours, slack_tokens=slack, reuse_workspace=True)[0].log_softmax(-1)
            b = reference.forward(torch.tensor([token]), theirs, slack_tokens=slack, reuse_workspace=True)[0].log_softmax(-1)
            kl += float((b.exp() * (b - a)).sum())
            agree += float(a.argmax() == b.argmax())
            nll_ours, nll_ref = nll_ours - float(a[following]), nll_ref - float(b[following])
        rows.append({"context": context, "steps": steps, "kl": round(kl / steps, 5), "top1_agreement": round(agree / steps, 4),
                     "nll_default": round(nll_ours / steps, 4), "nll_float32": round(nll_ref / steps, 4)})
        print(rows[-1], flush=True)
    meta.update(weights=lm.weights_label, document="P05", workspace=type(ours.layers[0]._workspace.held).__name__,
                step_copies=decoder.int8_steps,
                load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    common.write_results("decode_quality", rows, ["context", "steps", "kl", "top1_agreement", "nll_default", "nll_float32"], meta)


if __name__ == "__main__":
    main()
