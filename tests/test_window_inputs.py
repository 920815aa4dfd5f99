"""The window survives every input of issue 33 (B20–B30 in docs/REAL_WORLD_INPUTS.md).

Each case of tests/window_cases.py runs the real offscreen window in a process of its own, under an
address-space limit and a timeout: a crash (B20's title made Qt read /dev/zero until memory ran out)
or a freeze (B21's answer named a pipe nothing writes to) fails that case and leaves the test run
going.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

REPO = Path(__file__).resolve().parent.parent
MEMORY_LIMIT_BYTES = 4 * 1024**3  # address space; Python, torch and Qt reserve about 1 GiB of it
TIMEOUT_S = 150                   # a case takes seconds, most of them importing torch and Qt
CASES = ["B20", "B21", "B22", "B23", "B24", "B25", "B26", "B27", "B28", "B29", "B30"]
# The limit is set in the child before it becomes pytest: preexec_fn is unsafe in a process with threads.
LIMITED = "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0})); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"


@pytest.mark.parametrize("case", CASES)
def test_the_window_survives_each_input_under_a_memory_limit_and_a_timeout(case, corpus, tmp_path):
    command = [sys.executable, "-c", LIMITED.format(MEMORY_LIMIT_BYTES), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--basetemp", str(tmp_path / "run"), f"tests/window_cases.py::test_{case.lower()}"]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True,
                             env={**os.environ, "QT_QPA_PLATFORM": "offscreen", "HALAMAN_CORPUS": str(corpus)})
    try:
        out, _ = child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        pytest.fail(f"{case} froze the window (no end within {TIMEOUT_S} s):\n{out[-4000:]}")
    if child.returncode == 0 and " skipped" in out:
        pytest.skip(out.strip().splitlines()[-1])
    assert child.returncode == 0, f"{case} ended with exit status {child.returncode}:\n{out[-4000:]}"
    assert " passed" in out and " failed" not in out, out[-4000:]
