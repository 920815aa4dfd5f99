"""Where a 512-token prefill chunk goes at 8k: ours at a full budget against transformers' DynamicCache,
in one process, each part timed by wrapping its call (docs/BENCHMARKS.md section 5n).

    python bench/prefill_profile.py                          # split, 1 thread, 3 rounds
    python bench/prefill_profile.py --parts ab --against REV --rounds 3   # whole 8k prefill, REV's attention.py against this one
    python bench/prefill_profile.py --parts ab --columns --rounds 3        # flash column sums against blocked

split  The default model as the app loads it on this CPU (`load_model(weights="auto")`), Think Python's
       tokens. Ours: the default policy in compact positions with the INT4 archive written during the
       read (as `bench/speed.py --parts lengths`), `--held` tokens read, then one 512-token chunk timed
       `--rounds` times on a fork of that cache (budget full: 4,096 held + the chunk). transformers:
       the same weights and ids through the model's own forward (sdpa) with a DynamicCache of
       `--tokens` - 512 tokens, the chunk that ends at `--tokens` timed (cropped off after each round).
       Each part is a wrapped call; a part's time excludes the parts called inside it (a stack of
       timers), so the shares add up to the chunk. Rounds alternate ours / theirs.
ab     The whole `--tokens` prefill (archive written) with `engine/kvcache/attention.py` as of
       `--against` (imported beside the current one, the rest of the engine current) against this
       checkout's, or (`--columns`) this checkout's H2O column sums from the flash kernel against
       `column_sums.METHOD = "blocked"`; alternating, `--rounds` each; median tokens/s, whether every
       layer's kept positions (`LayerKV.index`) and scores are equal, and the share of kept
       positions both keep.

Run with `--threads 1` beside other work: read the shares and the interleaved ratios, not the ms.
Writes docs/bench/prefill_profile_<name>.{json,md} (machine, commit, load average at start and end).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


class Split:
    """Exclusive seconds per label: a wrapped call's time minus that of the wrapped calls inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[float] = []  # per open call: seconds its wrapped children took
        self._undo: list = []

    def wrap(self, owner, name: str, label: str) -> None:
        """Time `owner.name` (a function or method) under `label` until `restore`."""
        original = getattr(owner, name)
        self._undo.append((owner, name, original))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                inner = self._stack.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + spent - inner
                if self._stack:
                    self._stack[-1] += spent

        setattr(owner, name, timed)

    def restore(self) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def take(self) -> dict[str, float]:
        seconds, self.seconds = self.seconds, {}
        return seconds


def wrap_ours(split: Split) -> None:
    """Our chunk path's parts (see the module docstring)."""
    from engine.kvcache import attention, cache, column_sums
    from engine.kvcache.archive import ArchiveWriter
    from engine.kvcache.quant import KVFormat
    from engine.models import decoder
    from engine.models.int4_cpu import Int4Linear

    split.wrap(decoder.CompressedDecoder, "forward", "rest (embedding, MLP activation, residual adds, views)")
    split.wrap(Int4Linear, "forward", "projections (Int4Linear: bf16 copy / int4 kernel)")
    split.wrap(decoder, "rms_norm", "RMS norms")
    split.wrap(ArchiveWriter, "append", "archive write")
    split.wrap(cache, "rotate", "RoPE (held keys, residual + chunk, queries)")
    split.wrap(cache.LayerKV, "_dequantized_stable", "held tokens dequantized (INT4 -> float32)")
    split.wrap(cache, "attention_positions", "positions")
    split.wrap(cache, "chunk_attention", "attention: other ops (cat, casts, lse merge)")
    split.wrap(attention, "_flash_output", "attention: flash kernel, output")
    split.wrap(column_sums, "swapped_flash_sums", "attention: H2O column sums (flash kernel, swapped)")
    split.wrap(column_sums, "blocked_sums", "attention: H2O column sums (blocked bfloat16 matmuls)")
    split.wrap(cache.LayerKV, "_append", "append to residual")
    split.wrap(KVFormat, "encode", "INT4 quantization (pool flush and archive)")
    split.wrap(cache.LayerKV, "_evict", "eviction (select + keep)")
    split.wrap(cache.LayerKV, "compress", "compress: other (pool append)")
    split.wrap(cache.LayerKV, "attend", "attend: other (tail cat, scores split)")


def wrap_theirs(split: Split, model) -> None:
    """transformers' chunk path: the same Int4Linear modules, its attention function, RoPE, norms, cache update."""
    import importlib

    from transformers import DynamicCache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from engine.models.int4_cpu import Int4Linear

    family = importlib.import_module(type(model).__module__)
    split.wrap(type(model), "forward", "rest (embedding, MLP activation, residual adds, views)")
    split.wrap(Int4Linear, "forward", "projections (Int4Linear: bf16 copy / int4 kernel)")
    norm = type(model.model.norm)
    split.wrap(norm, "forward", "RMS norms")
    split.wrap(family, "apply_rotary_pos_emb", "RoPE (held keys, residual + chunk, queries)")
    split.wrap(DynamicCache, "update", "cache update (cat)")
    implementation = model.config._attn_implementation
    original = ALL_ATTENTION_FUNCTIONS[implementation]
    holder = type("Holder", (), {"f": staticmethod(original)})
    split.wrap(holder, "f", f"attention: {implementation} (flash kernel)")
    ALL_ATTENTION_FUNCTIONS[implementation] = holder.f
    split._undo.append((_Setter(ALL_ATTENTION_FUNCTIONS, implementation), "value", original))


class _Setter:
    """Lets `Split.restore` put a mapping's entry back with setattr."""

    def __init__(self, mapping, key) -> None:
        object.__setattr__(self, "mapping", mapping)
        object.__setattr__(self, "key", key)

    def __setattr__(self, name, value) -> None:
        self.mapping[self.key] = value


def archive_writer(lm, tokens: int, workdir: Path):
    from engine.kvcache.archive import ArchiveLayout, ArchiveWriter
    from engine.settings import CachePolicy, RecallSettings

    policy, recall, shape = CachePolicy(), RecallSettings(), lm.decoder.shape
    layout = ArchiveLayout(shape.num_layers, shape.kv_heads, shape.head_dim, tokens, recall.block_tokens,
                           recall.archive_bits, policy.group_size)
    return ArchiveWriter(workdir / f"profile-archive-{os.getpid()}.safetensors", layout, lm.decoder.rope)


def read_ours(lm, ids, writer):
    """Our cache after reading `ids` in chunks with the archive tap (the default policy, compact)."""
    from engine.models.decoder import ChunkTaps
    from engine.settings import CachePolicy

    policy = CachePolicy(position_mode="compact")
    cache = lm.decoder.new_cache(policy, "compact")
    for first in range(0, len(ids), policy.chunk_tokens):
        lm.decoder.forward(ids[first : first + policy.chunk_tokens], cache, taps=ChunkTaps(archive=writer))
    return cache


def split_part(args, lm, ids) -> None:
    import torch
    from transformers import DynamicCache

    from engine.models.decoder import ChunkTaps

    workdir = common.WORK
    writer = archive_writer(lm, args.tokens, workdir)
    held = read_ours(lm, ids[: args.held], writer)
    written = list(writer._written)  # each round writes the same chunk again (the writer allows no rewind)
    chunk_ids = ids[args.held : args.held + 512]
    theirs = DynamicCache()
    with torch.inference_mode():
        for first in range(0, args.tokens - 512, 512):
            lm.decoder.model(ids[None, first : first + 512], past_key_values=theirs, logits_to_keep=1)
    their_ids = ids[None, args.tokens - 512 : args.tokens]
    split = Split()
    totals = {"ours": [], "transformers": []}
    parts = {"ours": {}, "transformers": {}}
    for r in range(args.rounds):
        for side in ("ours", "transformers") if r % 2 == 0 else ("transformers", "ours"):
            with torch.inference_mode():
                if side == "ours":
                    twin = held.fork()
                    writer._written = type(writer._written)(written)
                    wrap_ours(split)
                    began = time.perf_counter()
                    lm.decoder.forward(chunk_ids, twin, taps=ChunkTaps(archive=writer))
                else:
                    wrap_theirs(split, lm.decoder.model)
                    began = time.perf_counter()
                    lm.decoder.model(their_ids, past_key_values=theirs, logits_to_keep=1)
                spent = time.perf_counter() - began
                split.restore()
                if side == "transformers":
                    theirs.crop(-512)  # transformers 5: a negative crop removes
            totals[side].append(spent)
            for label, s in split.take().items():
                parts[side].setdefault(label, []).append(s)
            print(f"round {r} {side}: {spent * 1000:.0f} ms", flush=True)
    writer.abort()
    rows = []
    for side, times in totals.items():
        total = common.median(times)
        for label, values in sorted(parts[side].items(), key=lambda kv: -common.median(kv[1])):
            rows.append({"engine": side, "part": label, "median_ms": round(1000 * common.median(values), 1),
                         "share": round(common.median(values) / total, 3)})
        rows.append({"engine": side, "part": "whole chunk", "median_ms": round(1000 * total, 1), "share": 1.0})
    meta = {**common.machine_info(), "threads": torch.get_num_threads(), "rounds": args.rounds, "held": args.held,
            "tokens": args.tokens, "ours_keys": held.layers[0].n_tokens + 512, "their_keys": args.tokens,
            "chunk_ms": {side: [round(1000 * s, 1) for s in v] for side, v in totals.items()},
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}
    write(f"prefill_profile_{args.name}", rows, ["engine", "part", "median_ms", "share"], meta)


def contenders(args) -> dict:
    """label -> a function that switches the engine to that code path (the old one first)."""
    import engine.kvcache.cache as cache_module
    from engine.kvcache import column_sums

    current = cache_module.chunk_attention

    def use(function, columns="auto"):
        def switch():
            cache_module.chunk_attention = function
            column_sums.METHOD = columns
        return switch

    if args.columns:
        return {"flash": use(current, "flash"), "blocked": use(current, "blocked")}
    old = common.module_at(args.against, "engine/kvcache/attention.py")
    return {args.against: use(lambda *a, **k: old.chunk_attention(*a, **k)), "now": use(current)}


def kept_overlap(a, b) -> float:
    """Mean over layers and KV heads of the share of `a`'s kept positions that `b` keeps too."""
    import torch

    shares = []
    for (index_a, _), (index_b, _) in zip(a, b, strict=True):
        for row_a, row_b in zip(index_a, index_b, strict=True):
            shares.append(float(torch.isin(row_a, row_b).float().mean()))
    return sum(shares) / len(shares)


def ab_part(args, lm, ids) -> None:
    import torch

    import engine.kvcache.cache as cache_module
    from engine.kvcache import column_sums

    current = cache_module.chunk_attention
    codes = contenders(args)
    rates: dict[str, list[float]] = {code: [] for code in codes}
    kept: dict[str, list] = {}
    for r in range(args.rounds):
        for code in list(codes) if r % 2 == 0 else list(codes)[::-1]:
            codes[code]()
            writer = archive_writer(lm, args.tokens, common.WORK)
            began = time.perf_counter()
            with torch.inference_mode():
                cache = read_ours(lm, ids[: args.tokens], writer)
            rates[code].append(args.tokens / (time.perf_counter() - began))
            writer.abort()
            kept[code] = [(layer.index.clone(), layer.score.clone()) for layer in cache.layers]
            print(f"round {r} {code}: {rates[code][-1]:.1f} tok/s", flush=True)
    cache_module.chunk_attention, column_sums.METHOD = current, "auto"
    first, second = kept.values()
    same_index = all(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))
    same_score = all(torch.equal(a[1], b[1]) for a, b in zip(first, second, strict=True))
    rows = [{"code": code, "prefill_tok_s": round(common.median(v), 1), "runs": [round(x, 1) for x in v]}
            for code, v in rates.items()]
    for row in rows:
        row["vs_old"] = round(row["prefill_tok_s"] / rows[0]["prefill_tok_s"], 3)
    meta = {**common.machine_info(), "threads": torch.get_num_threads(), "rounds": args.rounds, "tokens": args.tokens,
            "contenders": list(codes), "kept_index_equal": same_index, "scores_equal": same_score,
            "kept_overlap": round(kept_overlap(first, second), 5),
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}
    write(f"prefill_profile_{args.name}_ab", rows, ["code", "prefill_tok_s", "vs_old", "runs"], meta)


def write(name: str, rows: list[dict], columns: list[str], meta: dict) -> None:
    """docs/bench/<name>.json (meta + rows) and .md (the table under the meta's load and commit)."""
    table = common.markdown_table(rows, columns)
    print(f"\n## {name}\n\n{table}\n", flush=True)
    (common.OUT / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    head = {k: meta.get(k) for k in ("cpu", "engine_commit", "date", "threads", "load_avg_at_start", "load_avg_at_end") if k in meta}
    (common.OUT / f"{name}.md").write_text(f"{json.dumps(head, default=str)}\n\n{table}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["split"], choices=["split", "ab"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=8192, help="transformers' chunk ends here; ab reads this many")
    parser.add_argument("--held", type=int, default=4608, help="tokens ours reads before the timed chunk (a full budget)")
    parser.add_argument("--against", help="ab: the commit whose engine/kvcache/attention.py is the old path")
    parser.add_argument("--columns", action="store_true",
                        help="ab: this checkout's H2O column sums, flash kernel (old) against blocked matmuls")
    parser.add_argument("--name", default="default")
    args = parser.parse_args()
    if "ab" in args.parts and bool(args.against) == args.columns:
        parser.error("ab needs either --against REV or --columns")
    common.setup(args.threads)
    import torch

    from engine.models.loader import load_model

    lm = load_model("default", device="cpu", weights="auto", threads=args.threads)
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[: max(args.tokens, args.held + 512)])
    if "split" in args.parts:
        split_part(args, lm, ids)
    if "ab" in args.parts:
        ab_part(args, lm, ids)


if __name__ == "__main__":
    main()
