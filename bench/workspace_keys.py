"""How the decode workspace should hold its bfloat16 keys: one row per token, or transposed.

    python bench/workspace_keys.py --threads 2 --parts product steps --rounds 9

product: one layer's q·kᵀ of a decode step (3 KV heads of 3 query heads each, head_dim 64: the
embedded SmolLM2-135M's shape) over `--tokens` held keys in bfloat16, as
`Bf16Int8Workspace.logits` runs it: keys held `[kv_heads, n, head_dim]` and read through a
transposed view (today), or held transposed `[kv_heads, head_dim, n]` (before), and float32 keys
held transposed for reference. 30 layers' keys are read in turn, so each product starts from memory
as in a step (45 MB at 4k, more than this CPU's L3); µs per layer, median of `--rounds`,
variants interleaved round by round; the largest difference from the float32 product.

steps: whole decode steps of the embedded model at `--context` tokens of Think Python (the
default policy: budget 4,096, compact positions), both layouts in one process, a fork of the same
snapshot per round, interleaved (ABAB), median of each round's median over 16 steps; the last
logits of both compared (`torch.equal`).

Writes docs/bench/workspace_keys_<parts>.{json,csv} with the machine and its load at start and end. Run
the parts in separate processes: the product's 400 MB of keys, once freed, slowed the steps after
it in the same process by a third in one run (both layouts alike).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SHAPE = (3, 3, 64)  # KV heads, query heads per KV head, head_dim
LAYERS = 30


def transposed_keys():
    """`Bf16Int8Workspace` as it was before: keys held transposed `[kv_heads, head_dim, n]`."""
    import torch

    from engine.kvcache.decode_workspace import Bf16Int8Workspace

    class TransposedKeys(Bf16Int8Workspace):
        def logits(self, q):
            return torch.bmm(q.to(torch.bfloat16), self._keys_t)

        def _hold_keys(self, keys):
            self._keys_t = keys.to(torch.bfloat16).transpose(1, 2).contiguous()

        def _append_keys(self, keys):
            self._keys_t = torch.cat((self._keys_t, keys.to(torch.bfloat16).transpose(1, 2)), 2)

        def _keep_keys(self, slots):
            self._keys_t = torch.gather(self._keys_t, 2, slots[:, None, :].expand(-1, self._keys_t.shape[1], -1))

        def _dense_keys(self):
            return self._keys_t.transpose(1, 2).float()

        def _key_tensors(self):
            return (self._keys_t,)

    return TransposedKeys


def part_product(tokens: list[int], rounds: int) -> list[dict]:
    import torch

    kv, group, d = SHAPE
    rows = []
    for n in tokens:
        keys = [torch.randn(kv, n, d) for _ in range(LAYERS)]
        q = torch.randn(kv, group, d)
        qb = q.bfloat16()
        held = {
            "rows (today)": [k.bfloat16().contiguous() for k in keys],
            "transposed (before)": [k.bfloat16().transpose(1, 2).contiguous() for k in keys],
            "float32 transposed": [k.transpose(1, 2).contiguous() for k in keys],
        }
        product = {
            "rows (today)": lambda k: torch.bmm(qb, k.transpose(1, 2)),
            "transposed (before)": lambda k: torch.bmm(qb, k),
            "float32 transposed": lambda k: torch.bmm(q, k),
        }
        times = {name: [] for name in held}
        for _ in range(rounds):
            for name, ks in held.items():
                for k in ks[:2]:
                    product[name](k)
                t0 = time.perf_counter()
                for _ in range(5):
                    for k in ks:
                        product[name](k)
                times[name].append((time.perf_counter() - t0) / (5 * LAYERS) * 1e6)
        reference = torch.bmm(q, keys[0].transpose(1, 2))
        for name in held:
            error = (product[name](held[name][0]).float() - reference).abs().max().item()
            rows.append({"part": "product", "tokens": n, "variant": name, "us_per_layer": common.median(times[name]),
                         "max_error": error})
            print(rows[-1], flush=True)
    return rows


def part_steps(context: int, rounds: int) -> list[dict]:
    import torch

    import engine.kvcache.cache as cache_module
    from engine.kvcache.cache import DECODE_EVICTION_SLACK_TOKENS
    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    lm = load_model("default", device="cpu", weights="int4", threads=torch.get_num_threads())
    dec = lm.decoder
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[:context])
    snapshot = dec.new_cache(CachePolicy(), "compact")
    for first in range(0, context, 512):
        dec.forward(ids[first : first + 512], snapshot)
    today = cache_module.packed_workspace
    before_class = transposed_keys()

    def before(*args):
        packed = today(*args)
        return before_class if packed is not None and packed.__name__ == "Bf16Int8Workspace" else packed

    variants = {"rows (today)": today, "transposed (before)": before}
    times, last = {name: [] for name in variants}, {}
    for _ in range(rounds):
        for name, chooser in variants.items():
            cache_module.packed_workspace = chooser
            try:
                twin, token, steps = snapshot.fork(), 42, []
                for _ in range(17):  # the first step builds the workspace: not counted
                    t0 = time.perf_counter()
                    logits = dec.forward(torch.tensor([token]), twin, slack_tokens=DECODE_EVICTION_SLACK_TOKENS,
                                         reuse_workspace=True)
                    steps.append(time.perf_counter() - t0)
                    token = int(logits[-1].argmax())
                held = twin.layers[0]._workspace.held
            finally:
                cache_module.packed_workspace = today
            times[name].append(common.median(steps[1:]) * 1e3)
            last[name] = (logits, type(held).__name__)
        print({name: round(t[-1], 2) for name, t in times.items()}, flush=True)
    equal = torch.equal(last["rows (today)"][0], last["transposed (before)"][0])
    base = common.median(times["transposed (before)"])
    return [{"part": "steps", "tokens": context, "variant": name, "step_ms": common.median(t),
             "speedup": base / common.median(t), "workspace": last[name][1], "logits_equal": equal}
            for name, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["product", "steps"], choices=["product", "steps"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 3968, 4096])
    parser.add_argument("--context", type=int, default=8192, help="tokens read before decoding (a multiple of 512)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    common.setup(args.threads)
    rows = []
    if "product" in args.parts:
        rows += part_product(args.tokens, args.rounds)
    if "steps" in args.parts:
        rows += part_steps(args.context, args.rounds)
    common.write_results("workspace_keys_" + "_".join(args.parts), rows, ["part", "tokens", "variant", "us_per_layer", "max_error", "step_ms",
                                                  "speedup", "workspace", "logits_equal"],
                         {"threads": args.threads, "rounds": args.rounds, **common.machine_info()})


if __name__ == "__main__":
    main()
