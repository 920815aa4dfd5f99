"""How often to evict while answering: the mean decode step at each eviction batch (slack).

    python bench/eviction_slack.py                         # 64, 128, 256 tokens; 5 rounds; 8k context
    python bench/eviction_slack.py --slacks 64 128 --rounds 9 --steps 384

While decoding, the cache may exceed its budget by `slack` tokens before it evicts back down to it
(`engine.kvcache.cache.decode_eviction_slack`: 1/32 of it). An eviction costs about the same at any
batch size (it selects among, and compacts, the whole budget), so a larger batch pays it less
often, while each step attends up to `slack` more tokens. The median step a speed table quotes
never contains one; an answer's mean does. This reads `--context` tokens of P05 into the embedded
model's compressed cache (default policy, compact positions, as `bench/decode_profile.py` does),
then per round and slack (the slacks' order reversed every other round) decodes `--steps` greedy
tokens from a fork of it and records the mean, median and slowest step (the first step, which
builds the decode workspace, left out) and the tokens held at the end. Medians over rounds.
Writes docs/bench/eviction_slack.{json,csv} with the machine, its copy bandwidth and the load average
at start and end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import decode_profile


def decode(lm, cache, steps: int, slack: int) -> dict:
    """`steps` greedy decode steps on a fork of `cache` evicting at `slack`: step times in ms."""
    import torch

    twin, token, times = cache.fork(), 42, []
    with torch.inference_mode():
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            logits = lm.decoder.forward(torch.tensor([token]), twin, slack_tokens=slack, reuse_workspace=True)
            times.append((time.perf_counter() - t0) * 1e3)
            token = int(logits[-1].argmax())
    times = times[1:]
    return {"mean_ms": statistics.mean(times), "median_ms": statistics.median(times), "max_ms": max(times),
            "held_tokens": twin.n_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slacks", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--context", type=int, default=8192, help="tokens read before decoding (a multiple of 512)")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    common.setup(args.threads)
    meta = {**common.machine_info(), "copy_gb_s": common.copy_bandwidth_gb_s()}
    lm = decode_profile.load("default", args.threads)
    cache = decode_profile.snapshot(lm, decode_profile.book_ids(lm, args.context))
    runs: dict[int, list[dict]] = {slack: [] for slack in args.slacks}
    for r in range(args.rounds):
        for slack in args.slacks if r % 2 == 0 else args.slacks[::-1]:
            runs[slack].append(decode(lm, cache, args.steps, slack))
        print(f"round {r}: " + ", ".join(f"{s}: {runs[s][-1]['mean_ms']:.1f} ms" for s in args.slacks)
              + f", load {os.getloadavg()[0]:.2f}", flush=True)
    base = statistics.median(run["mean_ms"] for run in runs[args.slacks[0]])
    rows = []
    for slack, found in runs.items():
        row = {"slack_tokens": slack, "context": args.context, "steps": args.steps, "rounds": args.rounds,
               **{key: statistics.median(run[key] for run in found) for key in ("mean_ms", "median_ms", "max_ms", "held_tokens")}}
        row["mean_tok_s"] = 1000 / row["mean_ms"]
        row["mean_vs_first"] = base / row["mean_ms"]
        rows.append(row)
    meta["load_avg_at_end"] = list(os.getloadavg())
    common.write_results("eviction_slack", rows, ["slack_tokens", "context", "steps", "rounds", "mean_ms", "median_ms",
                                                   "max_ms", "mean_tok_s", "mean_vs_first", "held_tokens"], meta)


if __name__ == "__main__":
    main()
