"""Time to the first answer of `halaman ask` on a document never opened before, as a new user runs it.

    python bench/first_answer.py [--runs 3] [--document pdf/P16_thinkpython2.pdf]
                                 [--question "Who published this book?"] [--read later]
                                 [--model shape]

Each run is a fresh HALAMAN_HOME (no prefix cache, no text index, no history) holding only the
embedded model already converted (copied from a first run's home, as on a machine that has started
Halaman once), and a real `halaman ask` process: the time from its start to the first byte of the
answer on stdout, the whole command, and what its report says (sources, recall, read). `--read
first` gives the read-first command for comparison (a whole read: minutes for a book). `--model
shape` asks with Qwen2.5-1.5B's shape (bench/speed.py's seeded random weights, the embedded
tokenizer) instead of the embedded model: its answer is noise, its times are a 1.5B model's. Each
row also splits the wait: the model's load (the command's "loaded in" line), then the rest.
Results: docs/bench/first_answer.{json,csv}.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HALAMAN = Path(sys.executable).with_name("halaman")


def converted_models(work: Path) -> Path:
    """The cache folder of a home that has started Halaman once: the embedded model converted, its
    file hashes noted (made by a first run's self-test)."""
    home = work / "seed-home"
    if not (home / "cache" / "models").exists():
        env = {**os.environ, "HALAMAN_HOME": str(home)}
        subprocess.run([str(HALAMAN), "self-test", "--no-prefix-cache", "--max-new-tokens", "1"], env=env,
                       check=True, capture_output=True, timeout=1800)
    return home / "cache"


def one_run(models: Path, document: Path, question: str, read: str, threads: int, model: str = "default",
            max_new_tokens: int | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="halaman-first-") as folder:
        home = Path(folder)
        shutil.copytree(models, home / "cache", ignore=shutil.ignore_patterns("prefix*", "archives"))
        env = {**os.environ, "HALAMAN_HOME": str(home)}
        load_before = os.getloadavg()[0]
        began = time.perf_counter()
        process = subprocess.Popen([str(HALAMAN), "ask", str(document), question, "--read", read,
                                    "--threads", str(threads), "--no-history", "--model", model]
                                   + (["--max-new-tokens", str(max_new_tokens)] if max_new_tokens else []),
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = os.read(process.stdout.fileno(), 1)  # not the buffered reader: communicate() reads the rest
        first_s = time.perf_counter() - began
        rest, err = process.communicate(timeout=7200)
        total_s = time.perf_counter() - began
        out = (first + rest).decode("utf-8", "replace")
    if process.returncode != 0:
        raise RuntimeError(f"halaman ask failed: {err.decode('utf-8', 'replace')[-2000:]}")
    answer, _, report = out.partition("--- report ---")
    lines = {line[:16].strip(): line[16:].strip() for line in report.splitlines() if len(line) > 16}
    loaded = re.search(r"loaded in ([0-9.]+) s", err.decode("utf-8", "replace"))
    load_s = float(loaded.group(1)) if loaded else None
    return {"read": read, "first_answer_s": round(first_s, 2), "command_s": round(total_s, 2),
            "model_load_s": load_s, "after_load_s": round(first_s - load_s, 2) if load_s is not None else None,
            "ttft": lines.get("TTFT", ""), "prefix": lines.get("prefix cache", "")[:120],
            "answer": answer.strip()[:200], "sources": lines.get("sources", ""), "recall": lines.get("recall", "")[:200],
            "load_at_start": round(load_before, 2), "load_at_end": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--document", default="pdf/P16_thinkpython2.pdf", help="a path in the test corpus")
    parser.add_argument("--question", default="Who published this book?")
    parser.add_argument("--read", default="later", choices=("later", "first"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="first_answer")
    parser.add_argument("--model", default="default", choices=("default", "shape"),
                        help="the embedded model, or Qwen2.5-1.5B's shape with random weights (bench/speed.py)")
    args = parser.parse_args()
    models = converted_models(common.WORK)
    document = common.corpus_dir() / args.document
    model, max_new_tokens = "default", None
    if args.model == "shape":
        import speed  # bench/speed.py: the shape's folder, written once
        # Its random weights decode noise to the answer's limit: the first word is what is timed.
        model, max_new_tokens = str(speed.shape_folder()), 16
    rows = []
    for run in range(args.runs):
        row = {"run": run + 1, **one_run(models, document, args.question, args.read, args.threads, model, max_new_tokens)}
        print(row, flush=True)
        rows.append(row)
    meta = {**common.machine_info(), "document": args.document, "question": args.question, "threads": args.threads,
            "model": args.model, "median_first_answer_s": statistics.median(r["first_answer_s"] for r in rows)}
    common.write_results(args.name, rows, list(rows[0]), meta)


if __name__ == "__main__":
    main()
