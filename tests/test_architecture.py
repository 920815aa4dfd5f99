"""The engine never imports Qt (import-linter contract in pyproject.toml), checked on every test run."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# pickle, or torch.load (which unpickles); safetensors.torch.load is the safe loader we use
UNSAFE = re.compile(r"^\s*(import|from)\s+pickle\b|(?<!safetensors\.)\btorch\.load\(", re.M)


def test_import_contract_engine_has_no_qt():
    linter = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(linter), str(REPO / "pyproject.toml")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "engine stays headless: no Qt KEPT" in out.stdout


def test_no_pickle_anywhere():
    offenders = [
        str(path) for folder in ("engine", "app") if (REPO / folder).is_dir()
        for path in (REPO / folder).rglob("*.py")
        if UNSAFE.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
