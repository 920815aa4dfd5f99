"""The import contracts in pyproject.toml ([tool.importlinter]), checked on every test run: the engine
never imports Qt, its layers go straight down with every module of a question's path on its floor,
the cloud client and the model never import each other, the estimator and settings are torch-free,
app/ never imports torch itself. And no import circle in engine/, no private name taken from
another module."""

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
    "engine layers: every module on the question path has its floor",
    "the cloud client and the model never import each other",
    "estimate and settings are torch-free",
    "app never imports torch itself",
)


def test_import_contracts_are_kept():
    linter = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(linter), str(REPO / "pyproject.toml")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CONTRACTS:  # each one ran (a contract dropped from pyproject.toml fails here)
        assert f"{name} KEPT" in out.stdout, out.stdout


def package_imports(package: str = "engine") -> dict[str, set[str]]:
    """`package`'s module (engine/ or app/) -> the modules of that package it imports anywhere in its
    file (at the top, inside a function, or for types only: each ties the two files together)."""
    modules = {}
    for path in (REPO / package).rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path

    def owner(name: str) -> str | None:  # "engine.session.DocumentSession" -> "engine.session"
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(package):
                targets = [owner(f"{node.module}.{alias.name}") or owner(node.module) for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [owner(alias.name) for alias in node.names if alias.name.startswith(f"{package}.")]
            else:
                continue
            graph[name].update(t for t in targets if t and t != name)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(component)
    return circles


def test_no_import_circle_in_the_engine_or_the_app():
    """A file that imports (directly or through others) a file that imports it back is one owner
    split in two: a new circle fails here, with the files that make it. No exemption: the
    documents package's readers take its types from `engine.documents.document`, not from the
    package `__init__` that dispatches to them."""
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert import_circles(package_imports("engine")) == []
    assert import_circles(package_imports("app")) == []


# The size rules of the style guide, for the engine: a function a reader can hold in view, a call
# whose arguments are few enough to name, a module that is one owner. The prefix store (its file
# format, the store, the bundle and its budget in one place) is the one module let past the limit.
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8
MAX_MODULE_LINES = 650
LONG_MODULES = {"engine/prefix_store.py"}


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter but `self` / `cls`; `*args` and `**kwargs` count one each."""
    args = function.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def size_offenders(folder: Path) -> list[str]:
    """'path: what is too big' for every module of `folder` over MAX_MODULE_LINES (but LONG_MODULES),
    function over MAX_FUNCTION_LINES (from `def` to its last line, decorators not counted) and
    function with more than MAX_PARAMETERS parameters."""
    offenders = []
    for path in sorted(folder.rglob("*.py")):
        name, source = path.relative_to(folder.parent).as_posix(), path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES and name not in LONG_MODULES:
            offenders.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{name}: {node.name} is {length} lines")
                if parameter_count(node) > MAX_PARAMETERS:
                    offenders.append(f"{name}: {node.name} takes {parameter_count(node)} parameters")
    return offenders


def test_engine_functions_and_modules_stay_small(tmp_path):
    sample = ast.parse("class C:\n    def f(self, a, /, b, *rest, c, **more): pass\n").body[0].body[0]
    assert parameter_count(sample) == 5  # a, b, rest, c, more
    long_call = tmp_path / "long_call.py"
    long_call.write_text("def f(a, b, c, d, e, f, g, h, i):\n" + "    pass\n" * 80, encoding="utf-8")
    assert [line.rpartition(": ")[2] for line in size_offenders(tmp_path)] == ["f is 81 lines", "f takes 9 parameters"]
    assert size_offenders(REPO / "engine") == []


def test_no_private_name_is_taken_from_another_module():
    """`from engine.x import _y` or `engine_module._y` reaches into another module's insides (a
    package's own modules may share its __init__'s helpers)."""
    offenders = []
    for folder in ("engine", "app", "tests", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            package = ".".join(path.relative_to(REPO).parent.parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            modules = {alias.asname or alias.name.rpartition(".")[2] for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine")
                       for alias in node.names if alias.name[:1] != "_"}
            modules |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                        for alias in node.names if alias.name.startswith("engine")}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine") and node.module != package:
                    offenders += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                                  if a.name.startswith("_") and not a.name.startswith("__")]
                elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                      and isinstance(node.value, ast.Name) and node.value.id in modules and node.value.id[:1].islower()
                      and (REPO / "engine" / f"{node.value.id}.py").exists()):
                    offenders.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert offenders == [], offenders


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


# Kinds that cross layers are typed members defined once in the engine (engine.progress.Phase,
# engine.errors.ErrorKind, engine.answer.StopReason, engine.recall_plan.RecallSource): comparing them with
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
