"""KV-cache memory: full FP16 vs. INT8 / INT4 vs. budget + INT4, at 8k / 32k / 128k tokens.

    python bench/kv_memory.py                    # ~5-10 min on 2 shared cores
    python bench/kv_memory.py --rss-lengths 8192 32768

Memory depends on shape only, so the three model shapes (SmolLM2-135M: L=30, H_kv=3, D=64;
Llama-3.2-3B: 28, 8, 128; Qwen2.5-3B: 36, 2, 128) are driven with random K/V:
  full FP16, measured   nbytes of a transformers DynamicCache filled layer by layer with
                        [1, H_kv, N, D] float16 tensors (allocated, not written: nbytes is exact)
  INT8 / INT4, no evict one `LayerKV` of Halaman's cache fed N random tokens in 512-token chunks
                        through its storage path (append, flush to the quantized pool), × L layers
  budget + INT4         the default policy (budget 4,096, window 1,024, sink 4, residual 128,
                        group 32, chunk 512) fed through `LayerKV.attend` (random queries, so H2O
                        scores and evictions are real), × L; "peak" is the largest total after a
                        chunk is appended and before it is evicted (budget + one chunk)
Every cache number is `CompressedCache.memory()` (codes + scales/zeros + 16-bit sinks/residual +
scores + positions + block table + free pool blocks), checked against the tensors' nbytes, next to
`engine.estimate`'s formula. Then the real embedded model: peak RSS growth of a child process
while prefilling Think Python, full transformers cache vs. Halaman's default, sampled every 5 ms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import common

GIB = 2**30
SHAPES = {"SmolLM2-135M": "smollm2-135m", "Llama-3.2-3B": "llama-3.2-3b", "Qwen2.5-3B": "qwen2.5-3b"}


def dynamic_cache_bytes(profile, n: int) -> int:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    total = 0
    for layer in range(profile.num_layers):
        k = torch.empty((1, profile.kv_heads, n, profile.head_dim), dtype=torch.float16)
        cache.update(k, torch.empty_like(k), layer)
        total += cache.layers[layer].keys.nbytes + cache.layers[layer].values.nbytes
    del cache
    return total


def one_layer(profile, policy, n: int, *, attend: bool) -> tuple[int, int, int]:
    """(bytes at rest, peak bytes after a chunk arrives, tensor nbytes at rest) of one layer after n tokens."""
    import torch

    from engine.kvcache.attention import RotaryTable
    from engine.kvcache.cache import CacheShape, LayerKV, StepOptions

    # query heads = KV heads: memory does not depend on them, attention cost does
    shape = CacheShape(1, profile.kv_heads, profile.head_dim, profile.kv_heads)
    layer = LayerKV(shape, policy, store_dtype=torch.float16, device=torch.device("cpu"))
    rope = RotaryTable(_Rotary(profile.head_dim), profile.head_dim, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    peak = 0
    step = policy.chunk_tokens
    for start in range(0, n, step):
        c = min(step, n - start)
        k = torch.randn((profile.kv_heads, c, profile.head_dim), generator=gen)
        v = torch.randn((profile.kv_heads, c, profile.head_dim), generator=gen)
        if attend:
            q = torch.randn((profile.kv_heads, c, profile.head_dim), generator=gen)
            layer.attend(q, k, v, start=start, rope=rope, scaling=profile.head_dim**-0.5, options=StepOptions(compact_positions=True))
        else:
            idx = torch.arange(start, start + c, dtype=torch.int32)
            layer._append(k, v, idx, torch.zeros((profile.kv_heads, layer.n_tokens + c)))
        peak = max(peak, layer.memory().total_bytes)
        layer.compress(start + c, 0)
    layer.paged.shrink()
    held = sum(t.nbytes for t in layer.tensors().values())
    return layer.memory().total_bytes, peak, held


class _Rotary:  # a plain RoPE (theta 1e4) for the random-K/V driver
    def __init__(self, dim: int) -> None:
        import torch

        self.inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))

    def __call__(self, x, positions):
        import torch

        freqs = positions[..., None].float() * self.inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def shape_rows(lengths: list[int], full_cap_bytes: int) -> list[dict]:
    from engine.estimate import KNOWN_SHAPES, compressed_cache_bytes, full_cache_bytes
    from engine.settings import CachePolicy

    rows = []
    default = CachePolicy()
    for label, key in SHAPES.items():
        p = KNOWN_SHAPES[key]
        for n in lengths:
            began = time.perf_counter()
            full = full_cache_bytes(p, n)
            measured = dynamic_cache_bytes(p, n) if full <= full_cap_bytes else None
            row = {"model": label, "shape": f"L={p.num_layers} H_kv={p.kv_heads} D={p.head_dim}", "tokens": n,
                   "full_fp16_formula_gib": full / GIB, "full_fp16_measured_gib": measured / GIB if measured else "formula only"}
            for bits in (8, 4):
                pol = CachePolicy(budget_tokens=n + 1024, window_tokens=1024, kv_bits=bits)
                rest, _, held = one_layer(p, pol, n, attend=False)
                row[f"int{bits}_gib"] = rest * p.num_layers / GIB
                row[f"int{bits}_formula_gib"] = compressed_cache_bytes(p, pol, n) / GIB
                row[f"int{bits}_matches_nbytes"] = rest == held
            rest, peak, held = one_layer(p, default, n, attend=True)
            row.update({
                "budget_int4_gib": rest * p.num_layers / GIB,
                "budget_int4_formula_gib": compressed_cache_bytes(p, default, n) / GIB,
                "budget_int4_peak_gib": peak * p.num_layers / GIB,
                "budget_matches_nbytes": rest == held,
                "x_smaller": full / (rest * p.num_layers),
                "seconds": time.perf_counter() - began,
            })
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def rss_child(kind: str, n: int) -> None:
    """In a child process: load the model, prefill n tokens of Think Python, print peak RSS growth."""
    import psutil
    import torch

    common.setup(1)
    lm = common.load_lm()
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[:n])
    with torch.inference_mode():  # touch the mmapped weights and warm the kernels before measuring
        lm.decoder.model(ids[None, :64], logits_to_keep=1)
        from engine.settings import CachePolicy

        lm.decoder.prefill(ids[:64], lm.decoder.new_cache(CachePolicy(), "original"))
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    began = time.perf_counter()
    kv = 0
    with torch.inference_mode():
        if kind == "full":
            from transformers import DynamicCache

            cache = DynamicCache()
            lm.decoder.model(ids[None], past_key_values=cache, logits_to_keep=1)
            kv = sum(l.keys.nbytes + l.values.nbytes for l in cache.layers)
        else:
            from engine.settings import CachePolicy

            cache = lm.decoder.new_cache(CachePolicy(), "original" if n <= 7680 else "compact")
            lm.decoder.prefill(ids, cache)
            kv = cache.memory().total_bytes
    seconds = time.perf_counter() - began
    done.set()
    thread.join()
    after = proc.memory_info().rss
    print(json.dumps({"peak_delta": peak[0] - base, "rest_delta": after - base, "kv_bytes": kv, "seconds": seconds}))


def rss_rows(lengths: list[int]) -> list[dict]:
    rows = []
    for n in lengths:
        for kind, label in (("full", "transformers DynamicCache (FP32, one call, sdpa)"), ("ours", "Halaman default (budget 4,096, INT4, chunk 512)")):
            if kind == "full" and n > 8192:
                continue  # beyond the model's positions
            out = subprocess.run([sys.executable, __file__, "--rss-child", kind, str(n)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"cache": label, "tokens": n, "kv_at_rest_mib": r["kv_bytes"] / 2**20,
                         "rss_peak_growth_mib": r["peak_delta"] / 2**20, "rss_after_mib": r["rest_delta"] / 2**20,
                         "prefill_s": r["seconds"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(rows: list[dict]) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=False)
    for ax, model in zip(axes, SHAPES):
        sub = [r for r in rows if r["model"] == model]
        xs = [r["tokens"] for r in sub]
        for col, label, style in (("full_fp16_formula_gib", "full FP16", "o-"), ("int8_gib", "INT8, no eviction", "s-"),
                                  ("int4_gib", "INT4, no eviction", "^-"), ("budget_int4_gib", "budget 4,096 + INT4 (default)", "D-"),
                                  ("budget_int4_peak_gib", "default, peak in prefill", "x--")):
            ax.plot(xs, [r[col] for r in sub], style, label=label, ms=4)
        ax.set(xscale="log", yscale="log", title=f"{model} ({sub[0]['shape']})", xlabel="tokens")
        ax.set_xticks(xs, [f"{x // 1024}k" for x in xs])
    axes[0].set_ylabel("KV cache GiB")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(common.OUT / "kv_memory.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="*", default=[8192, 32768, 131072])
    ap.add_argument("--full-cap-gib", type=float, default=16.0, help="largest DynamicCache to allocate (24 GiB RAM here)")
    ap.add_argument("--rss-lengths", type=int, nargs="*", default=[8192])
    ap.add_argument("--skip-shapes", action="store_true", help="only the peak-RSS part (keeps docs/bench/kv_memory.*)")
    ap.add_argument("--rss-child", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], int(args.rss_child[1]))
        return
    common.setup(1)
    began = time.perf_counter()
    meta = common.machine_info()
    if args.skip_shapes:
        rows = json.loads((common.OUT / "kv_memory.json").read_text())["rows"]
    else:
        rows = shape_rows(args.lengths, int(args.full_cap_gib * GIB))
        cols = ["model", "tokens", "full_fp16_formula_gib", "full_fp16_measured_gib", "int8_gib", "int4_gib",
                "budget_int4_gib", "budget_int4_peak_gib", "x_smaller", "budget_int4_formula_gib"]
        common.write_results("kv_memory", rows, cols, meta)
        plot(rows)
    rss = rss_rows(args.rss_lengths)
    common.write_results("kv_memory_prefill_rss", rss, ["cache", "tokens", "kv_at_rest_mib", "rss_peak_growth_mib", "rss_after_mib", "prefill_s"], meta)
    llama = next(r for r in rows if r["model"] == "Llama-3.2-3B" and r["tokens"] == 131072) if 131072 in args.lengths else None
    if llama:
        payload = 4224 * 2 * 28 * 8 * 128 // 2
        print(f"headline: Llama-3.2-3B 131,072 tokens FP16 = {llama['full_fp16_formula_gib']:.2f} GiB (formula), "
              f"{llama['full_fp16_measured_gib'] if isinstance(llama['full_fp16_measured_gib'], str) else round(llama['full_fp16_measured_gib'], 2)} GiB (DynamicCache nbytes); "
              f"4,224 tokens of INT4 codes = {payload / GIB:.3f} GiB before metadata; default cache at rest = {llama['budget_int4_gib']:.3f} GiB")
    print(f"kv_memory: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
