"""The projection kernels alone, on the Qwen2.5-1.5B shape's matrices (random weights): our torch
int4 kernel (`Int4Linear`, `Int8Linear` for the LM head), a float32 matmul, and ONNX Runtime's
`MatMulNBits` at accuracy levels 0 (float32 activations) and 4 (int8 activations, integer dot
products), at rows 1 (a decode step) and 512 (a prefill chunk), threads 1 and 2; on a CPU with
AVX-512 BF16 also the bfloat16 copy of the layer a prefill chunk runs there (`ours_bf16_copy`).

    python bench/int_projections.py                 # docs/bench/int_projections.{json,csv}
    python bench/int_projections.py --reps 9 --shapes q gate_up
    python bench/int_projections.py --parts quality   # docs/bench/int_projections_quality.{json,csv}
    python bench/int_projections.py --parts stream    # docs/bench/int_projections_stream.{json,csv}

Variants are interleaved (A B C D, A B C D, ...) and each reported time is the median of --reps
rounds, so a load change hits all of them alike; the ratios to float32 are per run. GOP/s counts
2 · rows · in · out operations. `call_us`: one call on a 32 × 16 matrix (per-call overhead).
`max_err`: max |y - x · Wᵀ| against the dequantized float32 weights (float64 product), at rows 1.

Part `stream`: gate_up at one row through `--copies` distinct copies in turn (165 MB of int4 codes
at 24, beyond the last-level cache, as a decode step streams its layers), torch kernel against
MatMulNBits level 4, 1 thread.

Part `quality`: the embedded model's next-token distributions over 4,096 tokens of P05 with full
attention (bench/weights_quality.py's quality part, BENCHMARKS §3), KL(float32 || int4) and top-1
agreement with the int4 layers on ONNX Runtime (`ort_matmul.int4_layers_on_ort`) and on the torch
kernel (the default), in one process; both without the bfloat16 reading copy a CPU
with AVX-512 BF16 keeps, so every row runs on the kernel compared, as a decode step's does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SHAPES = {  # name: (in, out, bits); the 1.5B shape: hidden 1536, intermediate 8960, 2 KV heads of 128
    "q": (1536, 1536, 4), "kv": (1536, 256, 4), "gate_up": (1536, 8960, 4), "down": (8960, 1536, 4),
    "lm_head": (1536, 49152, 8),  # the shape bench's vocabulary (the embedded tokenizer's), Q8_0 as loaded
}


def build(name: str, threads: int) -> dict:
    """The variants of one projection, as callables on float32 x [rows, in]."""
    import torch

    import ort_matmul as om
    from engine.models.int4_cpu import Int4Linear, Int8Linear, dense_chunks

    k, n, bits = SHAPES[name]
    torch.manual_seed(0)
    linear = torch.nn.Linear(k, n, bias=False)
    if bits == 4:
        codes, scales, zeros = om.q4_1_parts(linear.weight)
        ours = Int4Linear(linear, dense=False)
        dense = Int4Linear(linear, dense=True) if dense_chunks() else None
    else:
        (codes, scales), zeros = om.q8_0_parts(linear.weight), None
        ours, dense = Int8Linear(linear, step_copy=False), None
    weight = om.dequantized(bits, codes, scales, zeros)
    variants = {"ours": ours, "float32": lambda x, w=weight: torch.nn.functional.linear(x, w)}
    if dense is not None:  # what a chunk runs on a CPU with AVX-512 BF16: the bfloat16 copy (rows > KERNEL_ROWS)
        variants["ours_bf16_copy"] = lambda x, d=dense.dense: torch.nn.functional.linear(x.to(torch.bfloat16), d).float()
    for level in (0, 4):
        variants[f"ort_level{level}"] = om.OrtProjection(k, n, bits, codes, scales, zeros, threads=threads, accuracy_level=level)
    return {"variants": variants, "weight": weight, "k": k, "n": n}


def time_call(fn, x, budget_s: float = 0.05) -> float:
    """Seconds per call: calls repeated until `budget_s` has passed (at least one), averaged."""
    calls, t0 = 0, time.perf_counter()
    while True:
        fn(x)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s:
            return elapsed / calls


def measure(name: str, threads: int, rows: int, reps: int) -> list[dict]:
    import torch

    torch.set_num_threads(threads)
    built = build(name, threads)
    x = torch.randn(rows, built["k"])
    for fn in built["variants"].values():  # warm up (ORT's first run allocates)
        fn(x)
    times = {v: [] for v in built["variants"]}
    for _ in range(reps):
        for v, fn in built["variants"].items():
            times[v].append(time_call(fn, x))
    ref = x[:1].double() @ built["weight"].double().T
    out = []
    base = common.median(times["float32"])
    for v, fn in built["variants"].items():
        t = common.median(times[v])
        err = (fn(x[:1]).double() - ref).abs().max().item()
        out.append({"projection": name, "in": built["k"], "out": built["n"], "rows": rows, "threads": threads,
                    "variant": v, "ms": 1000 * t, "gop_s": 2 * rows * built["k"] * built["n"] / t / 1e9,
                    "vs_float32": base / t, "max_err": err, "out_max": ref.abs().max().item(),
                    "spread": (max(times[v]) - min(times[v])) / t})
    return out


def overhead(threads: int, reps: int) -> list[dict]:
    """Per-call cost on a tiny 32 → 16 projection at rows 1 (Python, binding, dispatch)."""
    import torch

    import ort_matmul as om
    from engine.models.int4_cpu import Int4Linear

    torch.set_num_threads(threads)
    linear = torch.nn.Linear(32, 16, bias=False)
    codes, scales, zeros = om.q4_1_parts(linear.weight)
    variants = {"ours": Int4Linear(linear), "float32": linear,
                "ort_level4": om.OrtProjection(32, 16, 4, codes, scales, zeros, threads=threads),
                "ort_level4_nozero": om.OrtProjection(32, 16, 4, codes, scales, None, threads=threads)}
    x = torch.randn(1, 32)
    times = {v: [] for v in variants}
    with torch.inference_mode():
        for _ in range(reps):
            for v, fn in variants.items():
                times[v].append(time_call(fn, x, 0.02))
    return [{"projection": "tiny 32x16", "rows": 1, "threads": threads, "variant": v, "call_us": 1e6 * common.median(t)}
            for v, t in times.items()]


def quality(tokens: int, threads: int) -> list[dict]:
    import ort_matmul as om
    import weights_quality

    from engine.models.int4_cpu import Int4Linear
    from engine.models.loader import load_model

    models = {name: load_model("default", device="cpu", weights=w, threads=threads)
              for name, w in (("float32", "full"), ("int4 onnxruntime", "int4"), ("int4 torch kernel", "int4"))}
    for module in models["int4 torch kernel"].decoder.model.modules():
        if isinstance(module, Int4Linear):
            module.dense = None  # every row through the kernel, as a decode step runs it (no bfloat16 reading copy)
    moved = om.int4_layers_on_ort(models["int4 onnxruntime"].decoder.model, threads)
    rows = weights_quality.quality(models, tokens)
    for row in rows:
        row["ort_layers"] = moved if row["weights"] == "int4 onnxruntime" else 0
    return rows


def stream(name: str, copies: int, reps: int) -> list[dict]:
    """A decode step's row through `copies` distinct copies of one projection in turn (their int4
    bytes beyond the last-level cache, as a real step streams its layers from memory): the torch
    kernel against MatMulNBits level 4, interleaved, 1 thread."""
    import torch

    import ort_matmul as om
    from engine.models.int4_cpu import Int4Linear

    torch.set_num_threads(1)
    k, n, _bits = SHAPES[name]
    torch.manual_seed(0)
    layers = [Int4Linear(torch.nn.Linear(k, n, bias=False)) for _ in range(copies)]
    sessions = [om.from_torch_int4(m.packed, m.scales_and_zeros, k, n, 1) for m in layers]
    x = torch.randn(1, k)
    runs = {"ours": lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), m.packed, 32, m.scales_and_zeros) for m in layers],
            "ort_level4": lambda: [s(x) for s in sessions]}
    times = {v: [] for v in runs}
    for _ in range(reps):
        for v, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[v].append((time.perf_counter() - t0) / copies)
    return [{"projection": name, "copies": copies, "rows": 1, "threads": 1, "variant": v, "ms": 1000 * common.median(t),
             "gop_s": 2 * k * n / common.median(t) / 1e9, "held_mb": copies * k * n * 0.625 / 1e6} for v, t in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 512])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--name", default="int_projections")
    ap.add_argument("--parts", nargs="*", default=["kernels"], choices=["kernels", "quality", "stream"])
    ap.add_argument("--copies", type=int, default=24, help="distinct copies of gate_up in the stream part")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens of P05 in the quality part")
    args = ap.parse_args()
    common.setup(1)
    import torch

    if "quality" in args.parts:
        meta = {**common.machine_info(), "model": "SmolLM2-135M-Instruct (embedded Q4_1 GGUF)", "threads": 1}
        common.write_results(args.name + "_quality", quality(args.tokens, 1),
                             ["weights", "tokens", "ppl", "ppl_vs_float32_pct", "kl_nats", "top1_agree", "ort_layers"], meta)
    if "stream" in args.parts:
        meta = {**common.machine_info(), "load_avg_start": " / ".join(f"{v:.2f}" for v in os.getloadavg())}
        with torch.inference_mode():
            rows = stream("gate_up", args.copies, args.reps)
        meta["load_avg_end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
        common.write_results(args.name + "_stream", rows, ["projection", "copies", "held_mb", "variant", "ms", "gop_s"], meta)
    if "kernels" not in args.parts:
        return

    import onnxruntime

    meta = {**common.machine_info(), "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "load_avg_start": " / ".join(f"{v:.2f}" for v in os.getloadavg())}
    rows = []
    with torch.inference_mode():
        for threads in args.threads:
            for name in args.shapes:
                for r in args.rows:
                    if name == "lm_head" and r > 1:
                        continue  # a prefill runs the LM head on its last row only
                    got = measure(name, threads, r, args.reps)
                    rows += got
                    print(f"{name} rows {r} threads {threads}: " + ", ".join(
                        f"{x['variant']} {x['gop_s']:.1f} GOP/s ({x['vs_float32']:.2f}x)" for x in got), flush=True)
    calls = [o for t in args.threads for o in overhead(t, args.reps)]
    print("per call:", ", ".join(f"{c['variant']}@{c['threads']} {c['call_us']:.0f} us" for c in calls))
    meta["load_avg_end"] = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    meta["per_call"] = calls
    common.write_results(args.name, rows, ["projection", "rows", "threads", "variant", "ms", "gop_s", "vs_float32",
                                           "max_err", "out_max"], meta)


if __name__ == "__main__":
    main()
