"""bench/cuda_check.py, the prepared GPU check: what runs without a GPU (its refusal and its plan)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "cuda_check.py"


def run(corpus, *args, cuda_hidden=True):
    env = {**os.environ, "HALAMAN_CORPUS": str(corpus)}
    if cuda_hidden:  # the same answer on a GPU machine
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_without_cuda_it_says_so_and_exits_2(corpus):
    done = run(corpus)
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr and "--dry-run" in done.stderr


def test_dry_run_builds_p05_and_32k_tokens_of_p16(corpus):
    done = run(corpus, "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    (p05, p05_tokens), (p16, p16_tokens) = plan["documents"].items()
    assert "Digital Millennium" in p05 and 9_000 < p05_tokens < 10_500
    assert "first" in p16 and 30_000 < p16_tokens <= 32_768
    assert all(len(questions) == 3 for questions in plan["questions"].values())
