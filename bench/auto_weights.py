"""What "auto" weights give a 1.5B model on a laptop CPU with 16 GiB of RAM, and what each format costs.

    python bench/auto_weights.py                  # NF4 and int4, 3 rounds, 1,024 tokens read
    python bench/auto_weights.py --rounds 5 --tokens 2048

On a CPU, "auto" once loaded every model whose float32 weights take over a quarter of RAM as
bitsandbytes NF4: on a 16 GiB laptop, Qwen2.5-1.5B (6.2 GB at float32) and everything larger. It
now streams any such model into int4 (`engine.models.weight_format.choose_weights`). This measures
both formats on the Qwen2.5-1.5B shape of `bench/speed.py --parts shape` (random bfloat16 weights,
the embedded model's vocabulary), each load in its own process, the formats alternating round by
round: peak RSS of the process (`ru_maxrss`), load time, read rate (`--tokens` tokens in 512-token
chunks into the engine's compressed cache) and answer rate (the median of `--decode-steps` decode
steps). Writes docs/bench/auto_weights.{json,csv}; the meta says which format "auto" chose on 16
GiB under each rule.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import common

CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
import torch
import speed
from engine.models.loader import load_model
folder, weights, tokens, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
began = time.perf_counter()
lm = load_model(folder, device="cpu", weights=weights, threads=threads)
load_s = time.perf_counter() - began
load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ids = torch.tensor(speed.common.book_token_ids(lm.tokenizer)[:tokens])
with tempfile.TemporaryDirectory() as tmp:
    rates = speed.trace_ours(lm, ids, [tokens], steps, Path(tmp))[tokens]
print(json.dumps({"weights": lm.weights, "weight_bytes": lm.weight_bytes, "load_s": load_s, "load_peak_rss_bytes": load_peak,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "read_tok_s": rates["prefill_tok_s"], "decode_tok_s": rates["decode_tok_s"]}))
"""

GIB = 1024**3
LAPTOP_RAM = 16 * GIB


def one_load(folder: Path, weights: str, tokens: int, steps: int, threads: int) -> dict:
    """One format's load, read and decode in a fresh process; raises RuntimeError with its last error line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(common.REPO), str(common.REPO / "bench")])}
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), weights, str(tokens), str(steps), str(threads)],
                          capture_output=True, text=True, env=env, cwd=common.REPO)
    if done.returncode:
        raise RuntimeError(f"{weights}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def auto_on_a_laptop(folder: Path) -> dict:
    """The format "auto" gives this folder on a 16 GiB CPU machine: under the old rule (as if no
    folder streamed) and now."""
    import torch
    from transformers import AutoConfig

    from engine.models.loader import full_weight_bytes
    from engine.models.stream_load import plan_stream
    from engine.models.weight_format import choose_weights

    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    plan = plan_stream(folder, config)
    full = full_weight_bytes(folder, torch.float32, config, plan)
    return {"float32_weight_gib": full / GIB,
            "auto_16gib_before": choose_weights("auto", "cpu", full, LAPTOP_RAM, streams=False),
            "auto_16gib_now": choose_weights("auto", "cpu", full, LAPTOP_RAM, streams=plan is not None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="loads of each format, alternating")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens read (a multiple of 512)")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    common.setup(args.threads)
    import speed

    folder = speed.shape_folder()
    meta = {**common.machine_info(), "threads": args.threads, "load_avg_start": speed.load_avg(), **auto_on_a_laptop(folder)}
    began, rows = time.perf_counter(), []
    for round_ in range(1, args.rounds + 1):
        for weights in ("4bit", "int4"):
            row = {"round": round_, **one_load(folder, weights, args.tokens, args.decode_steps, args.threads)}
            row.update({key.replace("_bytes", "_gib"): row[key] / GIB for key in ("weight_bytes", "load_peak_rss_bytes", "peak_rss_bytes")})
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta["load_avg_end"] = speed.load_avg()
    for held in ("nf4", "int4"):
        mine = [r for r in rows if r["weights"] == held]
        meta[f"{held}_median"] = {key: common.median([r[key] for r in mine]) for key in ("read_tok_s", "decode_tok_s", "load_s", "peak_rss_gib")}
    common.write_results("auto_weights", rows, ["round", "weights", "weight_gib", "load_s", "load_peak_rss_gib", "peak_rss_gib",
                                                "read_tok_s", "decode_tok_s"], meta)
    print(f"auto_weights: {time.perf_counter() - began:.0f} s, load {speed.load_avg()}")


if __name__ == "__main__":
    main()
