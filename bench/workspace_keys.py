"""How the decode workspace should hold its bfloat16 keys: one row per token, or transposed
(`engine.kvcache.key_layout`, which measures it once per process and model shape).

    python bench/workspace_keys.py --threads 2 --parts product --rounds 9
    python bench/workspace_keys.py --threads 2 --parts steps --rounds 9                    # the embedded model at 8k
    python bench/workspace_keys.py --threads 2 --parts steps --model shape --context 2048  # the 1.5B shape

product: one layer's q·kᵀ of a decode step over `--tokens` held keys in bfloat16, as
`Bf16Int8Workspace.logits` runs it, for the shapes of SmolLM2-135M (3 KV heads of 3 query heads,
head_dim 64), Qwen2.5-1.5B (2 of 6, 128) and Llama-3.2-3B (8 of 3, 128): keys held `[kv_heads, n,
head_dim]` and read through a transposed view ("rows"), or held transposed `[kv_heads, head_dim,
n]` ("transposed"). `LAYERS` layers' keys are read in turn, so each product starts from memory as in
a step; µs per layer, median of `--rounds`, the layouts interleaved round by round; whether both
give equal products, and the largest difference from the float32 product.

steps: whole decode steps of the embedded model (or `--model shape`: bench/speed.py's 1.5B shape)
at `--context` tokens of Think Python (the default policy: budget 4,096, compact positions), both
layouts in one process (`key_layout.METHOD`), a fork of the same snapshot per round, interleaved
(ABAB), median of each round's median over 16 steps; the last logits of both compared
(`torch.equal`); and what "auto" then chooses in that process.

Writes docs/bench/workspace_keys_<part>[_<model>_<context>].{json,csv} with the machine and its
load at start and end. Run the parts in separate processes: the product's keys, once freed, slowed
the steps after it in the same process by a third in one run (both layouts alike).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SHAPES = {"SmolLM2-135M": (3, 3, 64), "Qwen2.5-1.5B": (2, 6, 128), "Llama-3.2-3B": (8, 3, 128)}
"""KV heads, query heads per KV head, head_dim."""
LAYERS = 16


def part_product(tokens: list[int], rounds: int) -> list[dict]:
    import torch

    rows = []
    for model, (kv, group, d) in SHAPES.items():
        for n in tokens:
            keys = torch.randn(kv, n, d)
            q = torch.randn(kv, group, d)
            qb = q.bfloat16()
            held = {"rows": [keys.bfloat16().contiguous() for _ in range(LAYERS)],
                    "transposed": [keys.bfloat16().transpose(1, 2).contiguous() for _ in range(LAYERS)]}
            product = {"rows": lambda k: torch.bmm(qb, k.transpose(1, 2)), "transposed": lambda k: torch.bmm(qb, k)}
            times = {name: [] for name in held}
            for _ in range(rounds):
                for name, ks in held.items():
                    product[name](ks[0])
                    t0 = time.perf_counter()
                    for _ in range(3):
                        for k in ks:
                            product[name](k)
                    times[name].append((time.perf_counter() - t0) / (3 * LAYERS) * 1e6)
            reference = torch.bmm(q, keys.transpose(1, 2))
            outputs = {name: product[name](held[name][0]) for name in held}
            equal = torch.equal(outputs["rows"], outputs["transposed"])
            for name in held:
                rows.append({"part": "product", "model": model, "tokens": n, "variant": name,
                             "us_per_layer": common.median(times[name]), "logits_equal": equal,
                             "max_error": (outputs[name].float() - reference).abs().max().item()})
                print(rows[-1], flush=True)
            del held
    return rows


def part_steps(model: str, context: int, rounds: int) -> list[dict]:
    import torch

    from engine.kvcache import key_layout
    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    if model == "shape":
        import speed

        lm = load_model(str(speed.shape_folder()), device="cpu", weights="int4", threads=torch.get_num_threads())
    else:
        lm = load_model("default", device="cpu", weights="int4", threads=torch.get_num_threads())
    dec = lm.decoder
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[:context])
    snapshot = dec.new_cache(CachePolicy(), "compact")
    for first in range(0, context, 512):
        dec.forward(ids[first : first + 512], snapshot)
    variants = ("rows", "transposed")
    times, last = {name: [] for name in variants}, {}
    for _ in range(rounds):
        for name in variants:
            key_layout.METHOD = name
            try:
                twin, token, steps = snapshot.fork(), 42, []
                for _ in range(17):  # the first step builds the workspace: not counted
                    t0 = time.perf_counter()
                    logits = dec.forward(torch.tensor([token]), twin, slack_tokens=twin.decode_slack,
                                         reuse_workspace=True)
                    steps.append(time.perf_counter() - t0)
                    token = int(logits[-1].argmax())
                held = twin.layers[0]._workspace.held
            finally:
                key_layout.METHOD = "auto"
            times[name].append(common.median(steps[1:]) * 1e3)
            last[name] = (logits, held._transposed)
        print({name: round(t[-1], 2) for name, t in times.items()}, flush=True)
    key_layout.forget_choices()
    auto = key_layout.transposed_keys(dec.shape.kv_heads, dec.shape.group, dec.shape.head_dim, dec.device)
    assert not last["rows"][1] and last["transposed"][1], "a variant did not hold its layout"
    equal = torch.equal(last["rows"][0], last["transposed"][0])
    base = common.median(times["transposed"])
    return [{"part": "steps", "model": model, "tokens": context, "variant": name, "step_ms": common.median(t),
             "speedup": base / common.median(t), "logits_equal": equal,
             "auto_chooses": "transposed" if auto else "rows", "auto_measured": str(key_layout.measured())}
            for name, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["product"], choices=["product", "steps"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--context", type=int, default=8192, help="tokens read before decoding (a multiple of 512)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--model", default="default", choices=["default", "shape"],
                        help="steps: the embedded model, or the 1.5B shape of bench/speed.py (Qwen2.5-1.5B's)")
    args = parser.parse_args()
    common.setup(args.threads)
    rows = []
    if "product" in args.parts:
        rows += part_product(args.tokens, args.rounds)
    if "steps" in args.parts:
        rows += part_steps(args.model, args.context, args.rounds)
    name = "workspace_keys_" + "_".join(args.parts)
    if "steps" in args.parts:
        name += f"_{args.model}_{args.context}"
    common.write_results(name, rows, ["part", "model", "tokens", "variant", "us_per_layer", "max_error", "step_ms",
                                                  "speedup", "logits_equal", "auto_chooses"],
                         {"threads": args.threads, "rounds": args.rounds, **common.machine_info()})


if __name__ == "__main__":
    main()
