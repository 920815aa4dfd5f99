"""One-row (decode step) projections of the 1.5B shape: torch's int4 kernel against the candidates.

    python bench/int4_one_row.py --threads 1                 # needs numba for its two rows (pip install numba)

Each candidate multiplies one row by the same Q4_1 weights (random codes 0..15, bfloat16 scales and
zeros per 32 inputs, as `engine.models.int4_cpu.Int4Linear` holds them):
- `torch int4`: `aten._weight_int4pack_mm_for_cpu`, bfloat16 activations (the engine's kernel);
- `bf16 dense`: the weights dequantized to bfloat16, `F.linear` (oneDNN; the reading copy a CPU with
  AVX-512 BF16 keeps);
- `int8 rows`: the weights rounded to int8 per output feature, `aten._weight_int8pack_mm` (the LM
  head's step copy without AVX-512 BF16);
- `numba rows`: float32 activations against the same codes (two per byte: input j low, j + 16
  high, per group of 32), one output feature per `prange` iteration, each group's 16 bytes a
  reduction times its scale, plus min · Σx (`@njit(parallel=True, fastmath=True)`);
- `numba flat`: the same with the inputs split into the low and high nibbles' halves once per call,
  so each output feature is one flat loop over its bytes (the scale gathered per byte).
Variants interleaved round by round (ABAB…), median of `--rounds`; GOP/s = 2 · in · out / time.
Max error: |y − x · Wᵀ| against the dequantized float32 weights. `stream` rows: `--copies` distinct
copies of gate|up in turn (the codes come from memory, as in a real step), torch int4 / bf16 / int8.

Writes docs/bench/int4_one_row.{json,csv} with the machine and the load average at start and end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SHAPES = {"q|k|v": (2048, 1536), "o": (1536, 1536), "gate|up": (17920, 1536), "down": (1536, 8960)}


def numba_kernels():
    """(rows, flat) numba kernels, or None without numba."""
    try:
        import numba
        import numpy as np
    except ImportError:
        return None

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def rows(x, codes, scales, mins, out):
        n_out, groups = codes.shape[0], x.shape[0] // 32
        xs = np.empty(groups, np.float32)
        for g in range(groups):
            xs[g] = x[g * 32 : g * 32 + 32].sum()
        for o in numba.prange(n_out):
            acc = np.float32(0.0)
            for g in range(groups):
                dot = np.float32(0.0)
                for j in range(16):
                    b = codes[o, g * 16 + j]
                    dot += np.float32(b & 15) * x[g * 32 + j] + np.float32(b >> 4) * x[g * 32 + 16 + j]
                acc += scales[o, g] * dot + mins[o, g] * xs[g]
            out[o] = acc

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def flat(x, codes, scales, mins, out):
        n_out, half = codes.shape[0], codes.shape[1]
        groups = half // 16
        xlo, xhi, xs = np.empty(half, np.float32), np.empty(half, np.float32), np.empty(groups, np.float32)
        for i in range(half):
            xlo[i] = x[(i // 16) * 32 + i % 16]
            xhi[i] = x[(i // 16) * 32 + 16 + i % 16]
        for g in range(groups):
            xs[g] = x[g * 32 : g * 32 + 32].sum()
        for o in numba.prange(n_out):
            acc = np.float32(0.0)
            for i in range(half):
                b = np.uint32(codes[o, i])
                acc += (np.float32(b & np.uint32(15)) * xlo[i] + np.float32(b >> np.uint32(4)) * xhi[i]) * scales[o, i >> 4]
            low = np.float32(0.0)
            for g in range(groups):
                low += mins[o, g] * xs[g]
            out[o] = acc + low

    return rows, flat


def weights(n_out: int, k: int, seed: int) -> dict:
    """Q4_1 codes, scales and zeros of a random layer in each candidate's layout."""
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n_out, k), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n_out, k // 32, generator=g) * 0.02 + 0.001).to(torch.bfloat16)
    zero = (torch.randn(n_out, k // 32, generator=g) * 0.01).to(torch.bfloat16)
    w = (q.float() - 8) * scale.float().repeat_interleave(32, 1) + zero.float().repeat_interleave(32, 1)
    int8_scale = (w.abs().amax(1) / 127).to(torch.bfloat16)
    halves = q.view(n_out, k // 32, 2, 16)
    return {"w": w, "packed": torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1),
            "sz": torch.stack([scale.T, zero.T], -1).contiguous(), "dense": w.to(torch.bfloat16),
            "int8": torch.round(w / int8_scale.float()[:, None]).clamp(-127, 127).to(torch.int8), "int8_scale": int8_scale,
            "codes": (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n_out, k // 2).contiguous().numpy(),
            "scales": scale.float().numpy(), "mins": (zero.float() - 8 * scale.float()).numpy()}


def candidates(layer: dict, x, kernels) -> dict:
    import numpy as np
    import torch

    xb, xn = x.to(torch.bfloat16), x[0].numpy()
    out = np.empty(layer["packed"].shape[0], np.float32)
    found = {"torch int4": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, layer["packed"], 32, layer["sz"]),
             "bf16 dense": lambda: torch.nn.functional.linear(xb, layer["dense"]),
             "int8 rows": lambda: torch.ops.aten._weight_int8pack_mm(xb, layer["int8"], layer["int8_scale"])}
    if kernels is not None:
        for name, kernel in zip(("numba rows", "numba flat"), kernels, strict=True):
            found[name] = (lambda kernel=kernel: (kernel(xn, layer["codes"], layer["scales"], layer["mins"], out), torch.from_numpy(out))[1])
    return found


def timed(fns: dict, rounds: int, reps: int) -> dict:
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t0 = time.perf_counter()
            for _ in range(reps):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / reps)
    return {name: common.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--copies", type=int, default=12)
    args = parser.parse_args()
    common.setup(args.threads)
    import torch

    kernels = numba_kernels()
    if kernels is not None:
        import numba

        numba.set_num_threads(args.threads)
    meta, rows = common.machine_info(), []
    for name, (n_out, k) in SHAPES.items():
        layer, x = weights(n_out, k, 0), torch.randn(1, k)
        fns = candidates(layer, x, kernels)
        reference = x @ layer["w"].T
        errors = {c: float((f().float().reshape(1, -1) - reference).abs().max()) for c, f in fns.items()}  # also compiles
        for c, seconds in timed(fns, args.rounds, 20).items():
            rows.append({"shape": name, "out": n_out, "in": k, "memory": "cache", "candidate": c, "us": round(1e6 * seconds, 1),
                         "gop_s": round(2 * n_out * k / seconds / 1e9, 2), "max_error": round(errors[c], 5)})
            print(rows[-1], flush=True)
    n_out, k = SHAPES["gate|up"]
    layers = [{key: v for key, v in weights(n_out, k, seed).items() if key != "w"} for seed in range(args.copies)]
    x = torch.randn(1, k)
    per_layer = [candidates(layer, x, None) for layer in layers]
    fns = {c: (lambda c=c: [f[c]() for f in per_layer]) for c in per_layer[0]}
    for c, seconds in timed(fns, args.rounds, 2).items():
        seconds /= args.copies
        rows.append({"shape": "gate|up", "out": n_out, "in": k, "memory": f"stream ({args.copies} copies)", "candidate": c,
                     "us": round(1e6 * seconds, 1), "gop_s": round(2 * n_out * k / seconds / 1e9, 2)})
        print(rows[-1], flush=True)
    meta.update(threads=args.threads, numba=None if kernels is None else __import__("numba").__version__,
                load_avg_at_end=[round(v, 2) for v in os.getloadavg()])
    common.write_results("int4_one_row", rows, ["shape", "out", "in", "memory", "candidate", "us", "gop_s", "max_error"], meta)


if __name__ == "__main__":
    main()
