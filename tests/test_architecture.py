"""The import contracts in pyproject.toml ([tool.importlinter]), checked on every test run: the engine
never imports Qt, its layers go straight down, the estimator and settings are torch-free, app/
never imports torch itself."""

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# pickle, or torch.load (which unpickles); safetensors.torch.load is the safe loader we use
UNSAFE = re.compile(r"^\s*(import|from)\s+pickle\b|(?<!safetensors\.)\btorch\.load\(", re.M)


CONTRACTS = (
    "engine stays headless: no Qt",
    "engine layers: cli > workspace > session > cloud | models > kvcache",
    "estimate and settings are torch-free",
    "app never imports torch itself",
)


def test_import_contracts_are_kept():
    linter = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(linter), str(REPO / "pyproject.toml")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CONTRACTS:  # each one ran (a contract dropped from pyproject.toml fails here)
        assert f"{name} KEPT" in out.stdout, out.stdout


def test_the_estimator_loads_without_torch():
    """What the contract claims, in a fresh interpreter: estimate and settings import no torch."""
    code = ("import sys, engine.estimate, engine.settings; "
            "from engine.estimate import KNOWN_SHAPES, estimate; from engine.settings import CachePolicy; "
            "estimate(KNOWN_SHAPES['llama-3.2-3b'], CachePolicy(), 131072); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_no_pickle_anywhere():
    offenders = [
        str(path) for folder in ("engine", "app") if (REPO / folder).is_dir()
        for path in (REPO / folder).rglob("*.py")
        if UNSAFE.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


# Kinds that cross layers are typed members defined once in the engine (engine.session.Phase,
# engine.errors.ErrorKind, engine.answer.StopReason, engine.session.RecallGap): comparing them with
# a string literal would be a second definition that drifts silently.
TYPED_ATTRIBUTES = {"phase", "stop_reason"}


def _is_text(node) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_text(item) for item in node.elts)


def _typed_kind(node) -> bool:
    """`x.phase`, `x.stop_reason`, an error's `.kind` (`error.kind`, `job_error.kind`), or why recall
    was off as a recall record stores it (`recall["off"]`, an `engine.workspace.RecallOff`)."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "off"
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr in TYPED_ATTRIBUTES:
        return True
    owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
    return node.attr == "kind" and owner.endswith("error")


def test_kinds_are_never_compared_as_strings():
    offenders = []
    for folder in ("engine", "app"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Compare):
                    sides = [node.left, *node.comparators]
                    if any(_typed_kind(side) for side in sides) and any(_is_text(side) for side in sides):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                      and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("recall ")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} (a warning's text)")
    assert offenders == []


def test_the_main_window_only_wires():
    """MainWindow wires panels to flows (issue 23): what follows an open, an answer or a settings
    change lives in app/open_flow.py, app/ask_flow.py and app/settings_flow.py, not here."""
    source = (REPO / "app" / "window.py").read_text(encoding="utf-8")
    window = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "MainWindow")
    assert window.end_lineno - window.lineno + 1 <= 400
