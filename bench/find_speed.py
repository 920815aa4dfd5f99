"""How fast `halaman find` answers, as a user runs it: a real process per run, wall and CPU time.

    python bench/find_speed.py [--runs 5] [--document pdf/P16_thinkpython2.pdf]
                               [--question "What is chapter 5 about?"] [--cpus 2]

Three cases, each in one scratch HALAMAN_HOME (bench/.work/find-home, made afresh per run of this script):
  first ever      the home holds nothing: the model's tokenizer is built (transformers reads the
                  GGUF's metadata; no weights are converted) and kept, the PDF parsed (1 run)
  new document    the tokenizer is kept, the PDF's parsed copy deleted before each run: parsed again
  opened before   the parsed copy and the tokenizer are kept (the issue's "≤ 3 s after its first open")
Per run: wall seconds from the process start to its exit, and its CPU seconds (user + sys of the
child, `resource.getrusage(RUSAGE_CHILDREN)`), so a busy machine's waiting shows as wall beyond
CPU. The load average is recorded before and after each case. `--cpus N` pins the child to N CPUs
(Linux `sched_setaffinity`; the target is 2 cores). Results: docs/bench/find_speed.{json,csv}.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common

CASES = ("first ever", "new document", "opened before")


def one_run(document: Path, question: str, env: dict, cpus: int) -> dict:
    """One `halaman find` process: its wall and CPU seconds and whether it listed rows."""
    def pin() -> None:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "engine.cli", "find", str(document), question], env=env,
                         cwd=common.REPO, capture_output=True, text=True, timeout=900, preexec_fn=pin)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"halaman find failed: {out.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rows": sum(1 for line in out.stdout.splitlines() if ". " in line)}


def forget_parse(home: Path) -> None:
    """Delete the parsed copies in the scratch `home` (the next find parses the document again)."""
    for entry in (home / "cache" / "parsed").glob("*.json"):
        entry.unlink()


def run_case(case: str, runs: int, document: Path, question: str, home: Path, cpus: int) -> dict:
    env = {**os.environ, "HALAMAN_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(common.REPO)}
    if case == "first ever":
        shutil.rmtree(home, ignore_errors=True)
    load_before = os.getloadavg()
    results = []
    for _ in range(1 if case == "first ever" else runs):
        if case == "new document":
            forget_parse(home)
        results.append(one_run(document, question, env, cpus))
    walls, cpus_used = [r["wall_s"] for r in results], [r["cpu_s"] for r in results]
    return {"case": case, "runs": len(results), "median_wall_s": statistics.median(walls),
            "median_cpu_s": statistics.median(cpus_used), "max_wall_s": max(walls), "walls_s": walls, "cpus_s": cpus_used,
            "rows": results[-1]["rows"], "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--document", default=f"pdf/{common.THINK_PYTHON}", help="a path in the test corpus, or any file")
    parser.add_argument("--question", default="What is chapter 5 about?")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs the find process may use (0 = all)")
    args = parser.parse_args()
    document = Path(args.document) if Path(args.document).exists() else common.corpus_dir() / args.document
    home = common.WORK / "find-home"
    started = common._run_start()
    rows = [run_case(case, args.runs, document, args.question, home, args.cpus) for case in CASES]
    meta = {"machine": {"cores": os.cpu_count(), "python": sys.version.split()[0], **started},
            "document": document.name, "question": args.question, "cpus": args.cpus,
            "command": f"halaman find {document.name} {args.question!r}"}
    common.write_results("find_speed", rows, ["case", "runs", "median_wall_s", "median_cpu_s", "max_wall_s",
                                              "load_avg_before", "load_avg_after"], meta)


if __name__ == "__main__":
    main()
