"""Peak memory (RSS) of loading a model, each load alone in its own process, before and after a commit.

    python bench/load_memory.py                     # this checkout against --before (default b76db12)
    python bench/load_memory.py --before HEAD~3     # another commit
    python bench/load_memory.py --only current      # this checkout only

Loads, each in a fresh process (`python -c`, PYTHONPATH at the checkout measured; a git worktree of
`--before` under bench/.work):
  shape       the Qwen2.5-1.5B shape of `bench/speed.py --parts shape` (random bfloat16 weights,
              49,152-token vocabulary), int4 weights as this CPU keeps them (with the bfloat16
              reading copy on a CPU with AVX-512 BF16, `engine.models.weight_format`)
  shape-lean  the same without the reading copy, as on a CPU without AVX-512 BF16 (the int8 step
              copy of the LM head instead): `dense_chunks` answers False in that process
  default-first  the embedded SmolLM2-135M GGUF in a fresh HALAMAN_HOME: its first-start
              conversion to a safetensors folder, then the int4 load
  default     the same home again: the converted folder only

Each process reports its RSS after importing torch and transformers (`base`), the peak RSS of the
whole process (`ru_maxrss`, which counts the safetensors pages it maps), the weight bytes the loaded
model holds (`LoadedModel.weight_bytes`) and the load's wall time (not a speed figure: measured on a
shared machine). Writes docs/bench/load_memory.{json,csv}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common

CHILD = """
import json, os, resource, sys, time
import psutil, torch, transformers  # noqa: F401 - counted in the base
import engine.models.int4_cpu as int4_cpu
import engine.models.loader as loader
spec, lean = sys.argv[1], sys.argv[2] == "lean"
if lean:  # as on a CPU without AVX-512 BF16: no bfloat16 reading copy, an int8 step copy of the LM head
    int4_cpu.dense_chunks = loader.dense_chunks = lambda: False
base = psutil.Process().memory_info().rss
began = time.perf_counter()
lm = loader.load_model(spec, device="cpu", weights="int4", threads=int(sys.argv[3]))
seconds = time.perf_counter() - began
print(json.dumps({"base_rss_bytes": base, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "end_rss_bytes": psutil.Process().memory_info().rss, "weight_bytes": lm.weight_bytes,
                  "load_s": seconds}))
"""

GIB = 1024**3


def measure(checkout: Path, spec: str, lean: bool, home: Path, threads: int) -> dict:
    """One load in its own process; raises RuntimeError with the child's last error line."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HALAMAN_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", CHILD, spec, "lean" if lean else "auto", str(threads)],
                          capture_output=True, text=True, env=env, cwd=checkout)
    if done.returncode:
        raise RuntimeError(f"{spec} at {checkout}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["peak_over_base_bytes"] = row["peak_rss_bytes"] - row["base_rss_bytes"]
    row["peak_over_weights_gib"] = (row["peak_rss_bytes"] - row["weight_bytes"]) / GIB
    return row


def checkouts(before: str, only: str) -> list[tuple[str, Path]]:
    head = subprocess.run(["git", "-C", str(common.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    pairs = []
    if only in ("both", "before"):
        tree = common.WORK / f"before-{before}"
        if not tree.exists():
            subprocess.run(["git", "-C", str(common.REPO), "worktree", "add", "--detach", str(tree), before], check=True)
        pairs.append((f"{before} (before)", tree))
    if only in ("both", "current"):
        pairs.append((f"{head} (this checkout)", common.REPO))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="b76db12", help="commit to compare this checkout with")
    ap.add_argument("--only", choices=["both", "before", "current"], default="both")
    ap.add_argument("--loads", nargs="*", default=["shape", "shape-lean", "default-first", "default"],
                    choices=["shape", "shape-lean", "default-first", "default"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    common.setup(args.threads)
    meta = common.machine_info()
    import speed

    shape = str(speed.shape_folder())
    rows = []
    for label, checkout in checkouts(args.before, args.only):
        with tempfile.TemporaryDirectory(dir=common.WORK) as home:
            for load in args.loads:
                spec = shape if load.startswith("shape") else "default"
                row = {"commit": label, "load": load,
                       **measure(checkout, spec, load == "shape-lean", Path(home), args.threads)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        if checkout != common.REPO:  # a checkout inside this one would be scanned by tests/test_docs.py
            subprocess.run(["git", "-C", str(common.REPO), "worktree", "remove", "--force", str(checkout)], check=True)
    for row in rows:
        for key in ("base_rss_bytes", "peak_rss_bytes", "end_rss_bytes", "weight_bytes", "peak_over_base_bytes"):
            row[key.replace("_bytes", "_gib")] = row[key] / GIB
    common.write_results("load_memory", rows, ["commit", "load", "weight_gib", "base_rss_gib", "peak_rss_gib",
                                               "peak_over_base_gib", "peak_over_weights_gib", "end_rss_gib", "load_s"], meta)


if __name__ == "__main__":
    main()
