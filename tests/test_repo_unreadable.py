"""A code folder that git cannot read in part or at all (issue 45): what was left out, and why,
is in the document's warnings. Folders and repositories are made here with git and os."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from engine.documents import load_document

NOBODY = 65534
pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
    pytest.mark.skipif(os.name == "nt", reason="POSIX permissions and owners"),
]


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def _project(parent: Path) -> Path:
    """A git work tree with main.py, a committed src/app.py and an untracked secret/keys.py."""
    root = parent / "project"
    (root / "src").mkdir(parents=True)
    (root / "secret").mkdir()
    _git(root, "init", "-q")
    (root / "main.py").write_text("print('main')\n")
    (root / "src" / "app.py").write_text("def app():\n    return 1\n")
    (root / "secret" / "keys.py").write_text("API_KEY_NAME = 'deploy'\n")
    _git(root, "add", "src/app.py")
    return root


_CHILD = """
import json, os, sys
from pathlib import Path
from engine.documents import load_document
load_document(Path(sys.argv[2]))  # every module this needs is imported before the switch
uid = int(sys.argv[3])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
document = load_document(Path(sys.argv[1]))
print(json.dumps({"labels": [s.label for s in document.segments], "warnings": document.warnings}))
"""


def _load_as(root: Path, uid: int | None) -> dict:
    """The document's labels and warnings, loaded by this process or, when `uid` is given, by a
    child that switches to that user (root reads every folder whatever its mode; the child
    starts as root, since this Python may live where that user cannot read)."""
    if uid is None:
        document = load_document(root)
        return {"labels": [s.label for s in document.segments], "warnings": document.warnings}
    warm_up = root.parent / "warm-up"
    warm_up.mkdir()
    (warm_up / "a.py").write_text("x = 1\n")
    env = dict(os.environ, HOME=str(root.parent))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(warm_up), str(uid)],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_folder_git_cannot_open_is_named_in_the_warnings():
    """Before: `git ls-files` said "could not open directory 'secret/'" on stderr, exited 0, and
    the folder was left out without a word."""
    parent = Path(tempfile.mkdtemp())
    try:
        parent.chmod(0o755)
        root = _project(parent)
        uid = None
        if os.geteuid() == 0:  # root opens any folder: read it as an ordinary user instead
            uid = NOBODY
            for folder, _, files in os.walk(parent):
                for name in [folder, *(os.path.join(folder, f) for f in files)]:
                    os.chown(name, NOBODY, NOBODY)
        (root / "secret").chmod(0)
        try:
            result = _load_as(root, uid)
        finally:
            (root / "secret").chmod(0o755)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    assert "main.py" in result["labels"] and "src/app.py" in result["labels"]
    notes = [w for w in result["warnings"] if "secret/" in w]
    assert notes and "git cannot read" in notes[0] and "Permission denied" in notes[0], result["warnings"]


@pytest.mark.skipif(os.name == "nt" or os.geteuid() != 0, reason="giving the folder to another user needs root")
def test_a_repository_git_refuses_says_why(tmp_path):
    """A repository owned by another user (a copied disk, a colleague's checkout): git refuses it
    ("dubious ownership"). Before: the folder was read without git's rules and nothing said so."""
    root = _project(tmp_path)
    for folder, _, files in os.walk(root):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, NOBODY, NOBODY)
    document = load_document(root)
    assert "main.py" in [s.label for s in document.segments]
    assert any("dubious ownership" in w and "another user" in w for w in document.warnings), document.warnings


def test_a_repository_whose_git_folder_is_gone_says_why(tmp_path):
    """A work tree copied without its repository: its .git file points at a folder that is gone
    (a moved `git worktree`, a submodule copied alone). Before: read without git, without a word."""
    root = tmp_path / "copy"
    root.mkdir()
    (root / ".git").write_text("gitdir: /nonexistent/repository/.git/worktrees/copy\n")
    (root / "main.py").write_text("print('main')\n")
    document = load_document(root)
    assert [s.label for s in document.segments] == ["main.py"]
    assert any("git cannot read this folder's repository" in w and "/nonexistent/repository" in w
               for w in document.warnings), document.warnings
