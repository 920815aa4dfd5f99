"""Prefill chunks on int4 weights unpacked just in time (`engine.models.int4_unpack`: to float32 on a
CPU without AVX-512 BF16, to bfloat16 on one with it) against torch's int4 kernel and, where the CPU
has AVX-512 BF16, against the bfloat16 reading copy a small model keeps. To run this machine as a
CPU without AVX-512 BF16 (most laptops), use the environment below.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python bench/int4_unpack.py --threads 2 --parts projections read quality --rounds 5

projections: the 1.5B shape's projections (Qwen2.5-1.5B: fused q|k|v 1536→2048, o 1536→1536, fused
gate|up 1536→17920, down 8960→1536) with random weights at `--rows` rows: the int4 kernel, the
unpacked product (`int4_unpack.product`, tile by tile) and the whole layer's unpacking alone, and
with AVX-512 BF16 the bfloat16 copy, interleaved round by round, median of `--rounds`; GFLOP/s = 2 ·
rows · in · out / time, against a float32 2048³ product in the same run.

read: the 1.5B shape loaded as the app loads it on this CPU (bench/speed.py's seeded weights; with
AVX-512 BF16 also with the reading copy it no longer keeps, made from its own codes), `--tokens`
tokens of Think Python read in 512-token chunks into a fresh cache (the default policy), the ways
alternating, `--rounds` each: median tokens/s and its share of the float32 matmul bound (2 FLOPs per
parameter per token at the measured rate); the last chunk's logits compared with the kernel's.

quality: the embedded model over 4,096 tokens of P05 in windows of 1,024 through its own forward
(full attention: only the weights' path differs), each way against the float32 model: mean
KL(float32 || int4) in nats per token and top-1 agreement (docs/BENCHMARKS.md §3).

Writes docs/bench/<--name>_<part>.{json,csv} (default int4_unpack_<part>) with the machine, torch's
kernel level and the load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SHAPES = {"q|k|v": (1536, 2048), "o": (1536, 1536), "gate|up": (1536, 17920), "down": (8960, 1536)}


def _chunk_dtype():
    import torch

    from engine.models.int4_cpu import dense_chunks

    return torch.bfloat16 if dense_chunks() else torch.float32


def part_projections(rows: int, rounds: int) -> list[dict]:
    import torch

    import speed
    from engine.models import int4_unpack
    from engine.models.int4_cpu import GROUP_SIZE, Int4Linear, dense_chunks

    bound = speed.roofline()["matmul_gflop_s"]
    dtype = _chunk_dtype()
    out = []
    for name, (i, o) in SHAPES.items():
        layer = torch.nn.Linear(i, o, bias=False)
        with torch.no_grad():
            layer.weight.normal_(0, 0.02)
        packed = Int4Linear(layer, dense=dense_chunks())
        x = torch.randn(rows, i).to(dtype)
        ways = {
            "int4 kernel": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed.packed, GROUP_SIZE,
                                                                              packed.scales_and_zeros),
            "unpacked": lambda: int4_unpack.product(x, packed.packed, packed.scales_and_zeros, i, o),
            "unpacking alone": lambda: int4_unpack.weight_t(packed.packed, packed.scales_and_zeros, i, o, dtype),
        }
        if packed.dense is not None:
            ways["bfloat16 copy"] = lambda: torch.nn.functional.linear(x, packed.dense)
        times = {way: [] for way in ways}
        for way in ways.values():
            way()
        for _ in range(rounds):
            for way, run in ways.items():
                t0 = time.perf_counter()
                run()
                times[way].append(time.perf_counter() - t0)
        flop = 2 * rows * i * o
        for way, t in times.items():
            ms = common.median(t) * 1e3
            out.append({"part": "projections", "projection": name, "rows": rows, "way": way, "unpacked_to": str(dtype)[6:],
                        "ms": ms, "gflop_s": flop / ms / 1e6 if way != "unpacking alone" else None,
                        "of_float32_rate": flop / ms / 1e6 / bound if way != "unpacking alone" else None,
                        "float32_gflop_s": bound})
            print(out[-1], flush=True)
    return out


class _Ways:
    """Switches a loaded model's `Int4Linear`s between the ways a chunk can run: "bfloat16 copy"
    (each layer's copy, made from its own codes where the load kept none: the same weights),
    "unpacked" and "int4 kernel"."""

    def __init__(self, model, copies: bool) -> None:
        import torch

        from engine.models import int4_unpack
        from engine.models.int4_cpu import Int4Linear

        self.layers = [m for m in model.modules() if type(m) is Int4Linear]
        self.kept = {m: m.dense for m in self.layers}
        self.copies = {}
        if copies:
            for m in self.layers:
                self.copies[m] = m.dense if m.dense is not None else int4_unpack.weight_t(
                    m.packed, m.scales_and_zeros, m.in_features, m.out_features, torch.bfloat16).T.contiguous()

    def names(self) -> list[str]:
        return (["bfloat16 copy"] if self.copies else []) + ["unpacked", "int4 kernel"]

    def set(self, way: str | None) -> None:
        from engine.models import int4_unpack

        for m in self.layers:
            m.dense = self.copies[m] if way == "bfloat16 copy" else self.kept[m] if way is None else None
        int4_unpack.UNPACKED_CHUNKS = way != "int4 kernel"


def part_read(tokens: int, rounds: int) -> list[dict]:
    import torch

    import speed
    from engine.models.int4_cpu import dense_chunks
    from engine.models.loader import load_model
    from engine.settings import CachePolicy

    lm = load_model(str(speed.shape_folder()), device="cpu", weights="int4", threads=torch.get_num_threads())
    loaded_with_copy = any(getattr(m, "dense", None) is not None for m in lm.decoder.model.modules())
    ways = _Ways(lm.decoder.model, copies=dense_chunks())
    ids = torch.tensor(common.book_token_ids(lm.tokenizer)[:tokens])
    bound = speed.roofline()["matmul_gflop_s"] * 1e9 / (2 * lm.parameters)
    times, last = {way: [] for way in ways.names()}, {}
    for _ in range(rounds):
        for way in times:
            ways.set(way)
            try:
                cache = lm.decoder.new_cache(CachePolicy(), "compact")
                t0 = time.perf_counter()
                for first in range(0, tokens, 512):
                    logits = lm.decoder.forward(ids[first : first + 512], cache)
                times[way].append(tokens / (time.perf_counter() - t0))
                last[way] = logits[-1].float().log_softmax(-1)
            finally:
                ways.set(None)
        print({way: round(t[-1], 1) for way, t in times.items()}, flush=True)
    kernel = last["int4 kernel"]
    base = common.median(times["int4 kernel"])
    return [{"part": "read", "tokens": tokens, "way": way, "read_tok_s": common.median(t), "all": [round(x, 1) for x in t],
             "vs_kernel": common.median(t) / base, "of_float32_bound": common.median(t) / bound, "bound_tok_s": bound,
             "last_logits_kl_to_kernel": float((last[way].exp() * (last[way] - kernel)).sum()),
             "same_top1_as_kernel": bool(last[way].argmax() == kernel.argmax()), "loaded_with_copy": loaded_with_copy}
            for way, t in times.items()]


def part_quality(tokens: int) -> list[dict]:
    import torch

    import weights_quality
    from engine.models.int4_cpu import dense_chunks
    from engine.models.loader import load_model

    full = load_model("default", device="cpu", weights="full", threads=torch.get_num_threads())
    int4 = load_model("default", device="cpu", weights="int4", threads=torch.get_num_threads())
    ways = _Ways(int4.decoder.model, copies=dense_chunks())
    ids = torch.tensor(full.tokenizer(weights_quality.p05_text(), add_special_tokens=False)["input_ids"][:tokens])
    windows = [ids[i : i + 1024] for i in range(0, len(ids) - 1, 1024) if len(ids[i : i + 1024]) > 1]
    targets = torch.cat([w[1:] for w in windows])
    with torch.inference_mode():
        ref = torch.cat([full.decoder.model(w[None]).logits[0, :-1].float() for w in windows])
        rows = []
        for way in ways.names():
            ways.set(way)
            try:
                logits = torch.cat([int4.decoder.model(w[None]).logits[0, :-1].float() for w in windows])
            finally:
                ways.set(None)
            m = common.logit_metrics(ref, logits, targets)
            rows.append({"part": "quality", "way": way, "unpacked_to": str(_chunk_dtype())[6:], "tokens": int(targets.numel()),
                         "kl_nats": m["kl"], "top1_agree": m["agree"]})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["projections"], choices=["projections", "read", "quality"])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048, help="read: tokens in 512-token chunks; quality: tokens of P05")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="int4_unpack", help="results go to docs/bench/<name>_<part>.*")
    args = parser.parse_args()
    common.setup(args.threads)
    import torch

    meta = {"threads": args.threads, "rounds": args.rounds, "kernel_level": torch.backends.cpu.get_cpu_capability(),
            **common.machine_info()}
    for part in args.parts:
        if part == "projections":
            rows = part_projections(args.rows, args.rounds)
        elif part == "read":
            rows = part_read(args.tokens, args.rounds)
        else:
            rows = part_quality(max(args.tokens, 4096))
        common.write_results(f"{args.name}_{part}", rows, [c for c in rows[0] if c != "all"], meta)


if __name__ == "__main__":
    main()
