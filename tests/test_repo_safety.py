"""B12 (docs/REAL_WORLD_INPUTS.md, docs/SECURITY.md): opening a folder never runs a program the
folder names. A repository that carries its own `.git` (a zip, a copied work tree) is made here with
real git, every kind of command-bearing setting is planted in it, each writing a marker file, and
each is first shown to run under a plain git command (so that the plant is live and the test can
fail); then `load_document` must run none of them and list the same files, from git."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.documents import load_document
from engine.documents.git import git_environment
from engine.documents.repo import list_files, load_repository

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")

HOOKS = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
    "pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update",
    "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
    "fsmonitor-watchman", "post-index-change",
)
"""Every hook githooks(5) names."""


def plain_git(root: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:  # noqa: A002
    """git as a careless caller runs it: the folder's config in force (the user's HOME kept)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t.invalid")
    return subprocess.run(["git", "-C", str(root), *args], input=input, capture_output=True, env=env,
                          stdin=None if input is not None else subprocess.DEVNULL, timeout=30, check=False)


def make_repo(root: Path) -> Path:
    """A committed work tree: two files, a .gitignore, and a .gitattributes naming a filter and a
    diff driver for every file (so that a planted driver has something to run on)."""
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# Planted\n\nThe backup runs at 02:00.\n")
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "debug.log").write_text("ignored\n")
    (root / ".gitattributes").write_text("*.py filter=planted diff=planted\n*.md filter=planted diff=planted\n")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", "init")):
        assert plain_git(root, *args).returncode == 0
    return root


def recorder(folder: Path, kind: str, marker: Path, *, passthrough: bool = False) -> str:
    """An executable that appends `kind` to `marker`; a filter copies stdin to stdout."""
    script = folder / f"planted-{kind}.sh"
    tail = "exec cat\n" if passthrough else "exit 1\n"
    script.write_text(f"#!/bin/sh\necho \"{kind} $*\" >> '{marker}'\n{tail}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def set_config(root: Path, key: str, value: str) -> None:
    assert plain_git(root, "config", key, value).returncode == 0


@dataclass(frozen=True)
class Kind:
    """One setting kind: `plant(root, command)` writes it; `control(root)` is a plain git call
    that runs it (None where git runs it only on a terminal: the pager)."""

    name: str
    plant: object
    control: object


def _plant_hooks(root: Path, command: str, *, default_folder: bool) -> None:
    folder = root / ".git" / "hooks" if default_folder else root.parent / "planted-hooks"
    folder.mkdir(exist_ok=True)
    for hook in HOOKS:
        target = folder / hook
        target.write_text(f"#!/bin/sh\nexec '{command}' {hook} \"$@\"\n")
        target.chmod(0o755)
    if not default_folder:
        set_config(root, "core.hooksPath", str(folder))


def _plant_filter(root: Path, command: str) -> None:
    for field in ("clean", "smudge"):
        set_config(root, f"filter.planted.{field}", command)
    set_config(root, "filter.planted.process", command)


def _plant_include(root: Path, command: str) -> None:
    included = root.parent / "planted.gitconfig"
    included.write_text(f"[core]\n\tfsmonitor = {command}\n")
    set_config(root, "include.path", str(included))


def _touch_then(root: Path, *args: str) -> subprocess.CompletedProcess:
    """Change a file, run git, put the file back: filters and diff drivers only run on changes."""
    app = root / "src" / "app.py"
    before = app.read_text()
    app.write_text(before + "# changed\n")
    try:
        return plain_git(root, *args)
    finally:
        app.write_text(before)


_CREDENTIAL_ASK = b"protocol=https\nhost=example.invalid\n\n"

KINDS = [
    Kind("fsmonitor", lambda r, c: set_config(r, "core.fsmonitor", c), lambda r: plain_git(r, "ls-files")),
    Kind("include-fsmonitor", _plant_include, lambda r: plain_git(r, "ls-files")),
    Kind("hooks-path", lambda r, c: _plant_hooks(r, c, default_folder=False),
         lambda r: plain_git(r, "commit", "--allow-empty", "-q", "-m", "x")),
    Kind("hooks-in-git-dir", lambda r, c: _plant_hooks(r, c, default_folder=True),
         lambda r: plain_git(r, "commit", "--allow-empty", "-q", "-m", "x")),
    Kind("filter", _plant_filter, lambda r: _touch_then(r, "add", "src/app.py")),
    Kind("diff-textconv", lambda r, c: set_config(r, "diff.planted.textconv", c), lambda r: _touch_then(r, "diff")),
    Kind("diff-external", lambda r, c: set_config(r, "diff.external", c), lambda r: _touch_then(r, "diff")),
    Kind("pager", lambda r, c: (set_config(r, "core.pager", c), set_config(r, "pager.ls-files", c)), None),
    Kind("credential-helper", lambda r, c: set_config(r, "credential.helper", c),
         lambda r: plain_git(r, "credential", "fill", input=_CREDENTIAL_ASK)),
    Kind("askpass", lambda r, c: set_config(r, "core.askPass", c),
         lambda r: plain_git(r, "credential", "fill", input=_CREDENTIAL_ASK)),
    Kind("ssh-command", lambda r, c: (set_config(r, "core.sshCommand", c),
                                      set_config(r, "remote.origin.url", "ssh://example.invalid/x.git")),
         lambda r: plain_git(r, "ls-remote", "origin")),
    Kind("editor", lambda r, c: set_config(r, "core.editor", c),
         lambda r: plain_git(r, "commit", "--allow-empty", "-q")),
]


def labels(root: Path) -> list[str]:
    return [segment.label for segment in load_document(root).segments]


def test_b12_zipped_project_with_fsmonitor_in_its_config(corpus, tmp_path):
    with zipfile.ZipFile(next((corpus / "bugs").glob("B12-*")) / "project.zip") as archive:
        archive.extractall(tmp_path)
    root, marker = tmp_path / "project", tmp_path / "FSMONITOR-RAN.txt"
    plain_git(root, "ls-files")
    assert marker.is_file(), "the corpus' planted command must run under plain git, or this test proves nothing"
    marker.unlink()
    document = load_document(root)
    assert not marker.exists()
    assert [s.label for s in document.segments] == ["README.md", "src/app.py"]
    assert list_files(root).source == "git"


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_no_planted_command_runs_and_the_listing_is_unchanged(tmp_path, kind):
    root = make_repo(tmp_path / "project")
    expected = labels(root)
    assert expected == [".gitattributes", ".gitignore", "README.md", "src/app.py"]
    marker = tmp_path / "RAN.txt"
    kind.plant(root, recorder(tmp_path, kind.name, marker, passthrough=kind.name == "filter"))
    if kind.control is not None:
        kind.control(root)
        assert marker.is_file(), f"the planted {kind.name} did not run under plain git: the plant is not live"
        marker.unlink()
    assert labels(root) == expected
    assert list_files(root).source == "git"  # git answered; not the fallback that never runs git
    assert not marker.exists(), marker.read_text()


def test_every_kind_at_once(tmp_path):
    root = make_repo(tmp_path / "project")
    expected = labels(root)
    marker = tmp_path / "RAN.txt"
    for kind in KINDS:
        kind.plant(root, recorder(tmp_path, kind.name, marker, passthrough=kind.name == "filter"))
    assert labels(root) == expected and list_files(root).source == "git"
    assert not marker.exists(), marker.read_text()


def test_callers_git_variables_do_not_redirect_git(tmp_path, monkeypatch):
    """Halaman started from a git hook (or a shell that exported GIT_DIR) lists the folder it is
    given, not the caller's repository."""
    other = make_repo(tmp_path / "other")
    (other / "only-in-other.txt").write_text("x\n")
    plain_git(other, "add", "-A")
    root = make_repo(tmp_path / "project")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))  # git would take the folder as that repository's work tree
    listing = list_files(root)
    assert listing.source == "git" and "only-in-other.txt" not in listing.files and "README.md" in listing.files
    allowed = {"GIT_CONFIG_NOSYSTEM", "GIT_TERMINAL_PROMPT", "GIT_NO_LAZY_FETCH", "GIT_OPTIONAL_LOCKS", "GIT_ASKPASS"}
    assert {name for name in git_environment() if name.startswith("GIT_")} == allowed


# --- names that act instead of showing --------------------------------------------------------

ACTING_NAMES = {
    "line\nbreak.md": "line\\nbreak.md",
    "title\x1b]0;pwned\x07.py": "title\\x1b]0;pwned\\x07.py",
    "invoice\u202egnp.py": "invoice\\u202egnp.py",
}


@pytest.mark.parametrize("use_git", [True, False], ids=["git", "no-git"])
def test_control_characters_in_names_are_shown_as_escapes(tmp_path, use_git):
    root = tmp_path / "names"
    root.mkdir()
    for name in ACTING_NAMES:
        (root / name).write_text("The backup runs at 02:00.\n")
    (root / "clear\x1b[2J.dat").write_bytes(b"\x00\x01binary")
    if use_git:
        plain_git(root, "init", "-q")
        plain_git(root, "add", "-A")
    document = load_document(root)
    assert sorted(s.label for s in document.segments) == sorted(ACTING_NAMES.values())
    assert "skipped (binary): clear\\x1b[2J.dat" in document.warnings
    shown = "".join([document.render(), document.title, *document.warnings])
    assert not any(ch in shown for ch in "\x1b\x07\u202e"), "a raw control character reached a label"


# --- symlinks never lead out of the folder ------------------------------------------------------

def test_a_tracked_folder_replaced_by_a_link_outside_is_not_followed(tmp_path):
    """The index lists notes/plan.txt; in the copy, notes/ is a symlink to a folder outside (a zip
    can carry both). git lists the path; Halaman must not read through the link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "plan.txt").write_text("SECRET-OUTSIDE\n")
    root = make_repo(tmp_path / "project")
    (root / "notes").mkdir()
    (root / "notes" / "plan.txt").write_text("inside\n")
    plain_git(root, "add", "-A")
    shutil.rmtree(root / "notes")
    (root / "notes").symlink_to(outside, target_is_directory=True)
    for use_git in (True, False):
        document = load_repository(root, use_git=use_git)
        assert "SECRET-OUTSIDE" not in document.render()
    assert "skipped (outside the folder): notes/plan.txt" in load_document(root).warnings


def test_a_symlinked_gitattributes_is_not_read_without_git(tmp_path):
    """git refuses a symlinked .gitattributes (2.32); the pathspec fallback must not follow one
    either: its target could mark every file as generated, or be any file outside the folder."""
    outside = tmp_path / "outside.attributes"
    outside.write_text("* linguist-generated\n")
    root = tmp_path / "plain"
    root.mkdir()
    (root / "app.py").write_text("print('hello')\n")
    (root / ".gitattributes").symlink_to(outside)
    document = load_document(root)
    assert [s.label for s in document.segments] == ["app.py"]


def test_a_git_in_the_current_folder_is_not_run(tmp_path, monkeypatch):
    """PATH with "." in it (or Windows, where Python 3.11 looks in the current folder first), and
    Halaman started inside the folder it opens: that folder's `git` must not be the git run."""
    root = make_repo(tmp_path / "project")
    marker = tmp_path / "RAN.txt"
    fake = root / "git"
    fake.write_text(f"#!/bin/sh\necho ran >> '{marker}'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([".", os.environ["PATH"]]))
    monkeypatch.chdir(root)
    assert list_files(root).source == "git" and not marker.exists()
