"""Repository and plain-text ingestion against the corpus' generated fixture repository
(repo/make_repo_fixture.py; cases R01-R06 in docs/CORPUS.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from engine.documents import (
    EmptyFileError, FileNotReadableError, NoTextFilesError, NotTextError, load_document, plain,
)
from engine.documents import repo
from engine.documents.repo import list_files, load_repository
from engine.errors import Cancelled

HAS_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
SECRET = "SECRET-OUTSIDE-REPO"


@pytest.fixture(scope="module")
def fixture_repo(corpus, tmp_path_factory):
    """The generated fixture (with the /dev/urandom link) and git's verdicts printed by it."""
    out = tmp_path_factory.mktemp("repo")
    done = subprocess.run(
        [sys.executable, str(corpus / "repo" / "make_repo_fixture.py"), str(out), "--with-dev-symlink"],
        capture_output=True, text=True, check=True, timeout=120)
    verdicts = dict((path, verdict) for verdict, path in
                    re.findall(r"^(INCLUDED|IGNORED)\s+(\S+)$", done.stdout, flags=re.M))
    return out / "fixture-repo", verdicts


# The three ways of deciding which files count: git itself, pathspec when git is not installed,
# and pathspec when the folder is not a git repository.
MODES = ["git", "no-git-installed", "not-a-repository"]


@pytest.fixture(params=MODES)
def loaded(request, fixture_repo, monkeypatch, tmp_path):
    root, verdicts = fixture_repo
    mode = request.param
    if mode == "git" and not HAS_GIT:
        pytest.skip("git is not installed")
    if mode == "no-git-installed":
        monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))  # git is not found
    if mode == "not-a-repository":
        copy = tmp_path / "fixture-repo"
        shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        (tmp_path / "outside-secret.txt").write_text(SECRET + "\n")  # keep escape.txt's target
        root = copy
    listing = list_files(root)
    assert listing.source == ("git" if mode == "git" else "gitignore")
    return load_document(root), listing, verdicts


def segment_paths(document) -> list[str]:
    return [segment.path for segment in document.segments]


def test_git_verdicts_are_reproduced(loaded):
    document, listing, verdicts = loaded
    assert verdicts, "the fixture printed no git verdicts"
    paths = segment_paths(document)
    for path, verdict in verdicts.items():
        assert (path in paths) == (verdict == "INCLUDED"), (path, verdict)
        if verdict == "IGNORED":
            assert path not in listing.files


def test_secret_outside_the_repository_is_never_read(loaded):
    document, _, _ = loaded
    assert SECRET not in document.render()
    assert not any(SECRET in warning for warning in document.warnings)


def test_nothing_is_skipped_silently(loaded):
    document, listing, _ = loaded
    read = set(segment_paths(document))
    mentioned = {match.group(1) for warning in document.warnings
                 if (match := re.match(r"^(?:skipped|decoded with fallback) \(.*?\): (.*)$", warning))}
    assert set(listing.files) <= read | mentioned
    assert any(w.startswith("ignored by .gitignore: ") and "debug.log" in w for w in document.warnings)


EXPECTED_SKIPS = {
    "static/vendor.min.js": "minified",
    "assets/logo.png": "binary",
    "data/model.bin": "binary",
    "data/late-binary.dat": "binary",  # first NUL after 2.8 KB
    "docs/nul-in-text.txt": "binary",
    "links/loop_a": "symlink loop",
    "links/loop_b": "symlink loop",
    "links/self": "symlink loop",
    "links/dir_up": "symlink to a folder",
    "links/escape.txt": "symlink pointing outside the folder",
    "links/inside.py": "symlink to src/app.py",
    "links/dangling": "dangling symlink",
    "links/urandom": "symlink pointing outside the folder",
}


def test_each_trap_is_skipped_for_its_reason(loaded):
    document, _, _ = loaded
    for path, reason in EXPECTED_SKIPS.items():
        assert f"skipped ({reason}): {path}" in document.warnings


def test_text_files_are_decoded_and_normalised(loaded):
    document, _, _ = loaded
    text = {segment.path: segment.text for segment in document.segments}
    assert text["docs/boundary.md"].endswith("リストの中に辞書を挿入")  # char across the 1 KB window
    assert text["legacy/latin1.txt"] == "Café crème brûlée, señor"
    assert "decoded with fallback (cp1252): legacy/latin1.txt" in document.warnings
    assert text["legacy/utf16.txt"] == "UTF-16 file with BOM: über"
    assert text["legacy/replacement-char.txt"] == "test\n\ufffd"  # kept (repomix #752)
    assert text["docs/crlf.txt"] == "line1\nline2"
    assert "héllo wörld" in text["src/app.py"]
    for path in ("a/vendor/f.txt", "notes/#hash.md", "weird name with spaces.txt", "unicodé/naïve.py"):
        assert path in text
    assert not any("\x00" in t or "\r" in t for t in text.values())


def test_render_is_sorted_marked_and_deterministic(loaded, fixture_repo):
    document, _, _ = loaded
    paths = segment_paths(document)
    assert paths == sorted(paths)
    rendered = document.render()
    assert rendered.startswith("=== .gitignore ===\n")
    assert "=== src/app.py ===\ndef main():" in rendered
    assert all(segment.label == segment.path for segment in document.segments)
    assert document.kind == "repo" and document.pages is None
    assert load_document(document.source).render() == rendered


@needs_git
def test_listing_equals_git_ls_files(fixture_repo, monkeypatch):
    root, _ = fixture_repo
    git = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others",
                          "--exclude-standard", "-z"], capture_output=True, check=True).stdout
    expected = sorted(os.fsdecode(p) for p in git.split(b"\0") if p)
    assert list_files(root).files == expected
    assert list_files(root, use_git=False).files == expected


def test_dev_urandom_link_does_not_hang(fixture_repo):
    root, _ = fixture_repo
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(load_repository(root, use_git=False)),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive() and result


def test_progress_counts_files_and_cancel_stops(fixture_repo):
    root, _ = fixture_repo
    calls: list[tuple[int, int]] = []
    load_repository(root, progress=lambda done, total: calls.append((done, total)))
    total = len(list_files(root).files)
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        load_document(root, cancel=cancel)


# --- .gitignore semantics: pathspec fallback against git itself ---------------------------------

IGNORE_CASES = [
    ({".gitignore": "foo/**\n!foo/keep.txt\n"}, ["foo/keep.txt", "foo/x.txt", "foo/bar/y.txt"]),
    ({".gitignore": "dir/*\n!dir/sub/\n"}, ["dir/a.txt", "dir/sub/b.txt", "dir/sub/c/d.txt"]),
    ({".gitignore": "*.txt\n!important.txt\n"}, ["a.txt", "important.txt", "x/important.txt"]),
    ({".gitignore": "/only-root.txt\n"}, ["only-root.txt", "x/only-root.txt"]),
    ({".gitignore": "logs/\n", "x/.gitignore": "!logs/\n"}, ["logs/a", "x/logs/a"]),
    ({".gitignore": "**/vendor/\n", "a/.gitignore": "!vendor\n", "a/vendor/.gitignore": "*.tmp\n"},
     ["a/vendor/f.txt", "a/vendor/g.tmp", "b/vendor/g.txt"]),
    ({".gitignore": "a/**/b\n"}, ["a/b", "a/x/b", "a/x/y/b", "a/x/bb"]),
    ({".gitignore": "*\n!*/\n!*.py\n"}, ["a.py", "a.txt", "d/b.py", "d/c.md"]),
    ({".gitignore": "build\n!build/keep\n"}, ["build/keep", "build/x"]),
    ({".gitignore": "\\#hash\n# comment\n\\!bang\n"}, ["#hash", "!bang", "comment"]),
    ({".gitignore": "*.log\n", "d/.gitignore": "!debug.log\n"}, ["x.log", "d/debug.log", "d/e/debug.log"]),
    ({".gitignore": "/*\n!/keep/\n/keep/*\n!/keep/this.txt\n"}, ["keep/this.txt", "keep/that.txt", "other/x"]),
    ({".gitignore": "a/*\n!a/b\na/b/*\n!a/b/c.txt\n"}, ["a/b/c.txt", "a/b/d.txt", "a/x.txt"]),
    ({".gitignore": "*/\n!keep/\n"}, ["keep/f", "other/f", "root.txt"]),
    ({"sub/.gitignore": "*\n!.gitignore\n"}, ["sub/a", "sub/d/b", "top"]),
    ({".gitignore": "*.log\t\n"}, ["build.log", "x.txt"]),  # B11: git strips trailing spaces only
    ({".gitignore": "*.log   \n*.tmp\\ \n"}, ["a.log", "b.tmp", "b.tmp ", "c.txt"]),  # escaped space kept
    ({".gitignore": "*.log\r\n/out\r\n"}, ["a.log", "out/x", "keep.txt"]),  # CRLF file
    ({".gitignore": "foo\\\n*.txt\n"}, ["a.txt", "foo", "b.md"]),  # a bad line is skipped, the rest holds
    pytest.param({".gitignore": "foo/**/\n"}, ["foo/a/b.txt", "foo/c.txt"], marks=pytest.mark.xfail(
        strict=True, reason="pathspec compiles 'foo/**/' so that it matches foo/ itself")),
]


@needs_git
@pytest.mark.parametrize(("ignore_files", "files"), IGNORE_CASES)
def test_pathspec_fallback_agrees_with_git(tmp_path, ignore_files, files):
    for rel, content in {**{f: "x\n" for f in files}, **ignore_files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert list_files(tmp_path, use_git=False).files == list_files(tmp_path).files


@needs_git
def test_b11_tab_after_a_pattern_is_part_of_it_as_in_git(tmp_path):
    (tmp_path / ".gitignore").write_text("*.log\t\n")
    (tmp_path / "build.log").write_text("started\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    fallback = list_files(tmp_path, use_git=False)
    assert fallback.files == [".gitignore", "build.log"] == list_files(tmp_path).files
    assert fallback.ignored == []


# --- limits and special files -------------------------------------------------------------------

def test_oversize_file_is_skipped_by_size_without_reading(tmp_path):
    (tmp_path / "small.py").write_text("x = 1\n")
    with open(tmp_path / "huge.log", "wb") as handle:
        handle.truncate(3 << 30)  # sparse: reading it would take seconds and 3 GiB
    document = load_repository(tmp_path, use_git=False)
    assert segment_paths(document) == ["small.py"]
    assert "skipped (too large: 3 GiB > 2 MiB): huge.log" in document.warnings


def test_size_limit_is_a_setting(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("x" * 100)
    monkeypatch.setattr(plain, "MAX_FILE_BYTES", 50)
    with pytest.raises(NoTextFilesError):
        load_repository(tmp_path, use_git=False)


def test_minified_code_is_skipped_but_long_prose_lines_are_not(tmp_path):
    (tmp_path / "bundle.js").write_text(("var a=1;" * 40 + "\n") * 20)  # 320-char lines
    (tmp_path / "one-line.css").write_text("a{b:c}" * 1000)
    (tmp_path / "README.md").write_text(("An unwrapped paragraph of prose. " * 30 + "\n\n") * 5)
    (tmp_path / "app.py").write_text("def f():\n    return 1\n")
    document = load_repository(tmp_path, use_git=False)
    assert segment_paths(document) == ["README.md", "app.py"]
    assert "skipped (minified): bundle.js" in document.warnings
    assert "skipped (minified): one-line.css" in document.warnings


def test_vendored_folders_are_reported_once(tmp_path):
    for rel in ("node_modules/a/index.js", "node_modules/b/index.js", "vendor/lib.go",
                "web/node_modules/c.js", "src/vendor/kept.go", "main.go"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("package main\n")
    document = load_repository(tmp_path, use_git=False)
    assert segment_paths(document) == ["main.go", "src/vendor/kept.go"]
    assert document.warnings == ["skipped (vendored): node_modules/", "skipped (vendored): vendor/",
                                 "skipped (vendored): web/node_modules/"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_skipped_without_blocking(tmp_path):
    (tmp_path / "a.txt").write_text("text\n")
    os.mkfifo(tmp_path / "pipe")
    document = load_repository(tmp_path, use_git=False)
    assert segment_paths(document) == ["a.txt"]
    assert "skipped (not a regular file): pipe" in document.warnings


def test_unreadable_file_is_listed(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("running as root: chmod 000 does not stop root from reading")
    (tmp_path / "ok.txt").write_text("fine\n")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret\n")
    locked.chmod(0)
    try:
        document = load_repository(tmp_path, use_git=False)
        assert "skipped (unreadable: permission denied): locked.txt" in document.warnings
        with pytest.raises(FileNotReadableError) as error:
            load_document(locked)
        assert "\n" not in str(error.value) and "locked.txt" in str(error.value)
    finally:
        locked.chmod(0o600)


def test_permission_error_is_listed_even_as_root(tmp_path, monkeypatch):
    # The same path as chmod 000, simulated so that it also runs where tests run as root.
    (tmp_path / "ok.txt").write_text("fine\n")
    (tmp_path / "locked.txt").write_text("secret\n")
    real_open = os.open

    def deny(path, flags, *args):
        if str(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(plain.os, "open", deny)
    document = load_repository(tmp_path, use_git=False)
    assert segment_paths(document) == ["ok.txt"]
    assert "skipped (unreadable: permission denied): locked.txt" in document.warnings
    with pytest.raises(FileNotReadableError) as error:
        load_document(tmp_path / "locked.txt")
    assert str(error.value) == "locked.txt cannot be read (permission denied): check the file's permissions"


def test_folder_without_text_files_is_an_error(tmp_path):
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(NoTextFilesError) as error:
        load_document(tmp_path)
    assert "\n" not in str(error.value) and tmp_path.name in str(error.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NoTextFilesError):
        load_document(empty)


# --- single text files ------------------------------------------------------------------------

def test_single_text_file_is_one_segment(tmp_path):
    path = tmp_path / "notes.md"
    path.write_bytes(b"# Notes\r\n\r\nCaf\xe9\x01 time\r\n")
    document = load_document(path)
    assert document.kind == "text" and document.title == "notes.md"
    assert document.render() == "=== notes.md ===\n# Notes\n\nCafé time\n"
    assert document.segments[0].path is None and document.segments[0].page is None
    assert document.warnings == ["decoded with fallback (cp1252): notes.md"]


def test_nul_after_the_sniff_window_is_stripped(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"line\n" * 2000 + b"late\x00nul\n")  # NUL at byte 10,004
    assert load_document(path).segments[0].text.endswith("line\nlatenul")


def test_bad_single_files_give_one_line_errors(tmp_path):
    cases = {"empty.txt": (b"", EmptyFileError), "blank.txt": (b" \n\t\x01\n", EmptyFileError),
             "blob.bin": (b"\x00\x01\x02" * 100, NotTextError)}
    for name, (data, error_type) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(error_type) as error:
            load_document(tmp_path / name)
        assert "\n" not in str(error.value) and name in str(error.value)
    with pytest.raises(FileNotReadableError) as error:
        load_document(tmp_path / "missing.txt")
    assert "missing.txt" in str(error.value) and "\n" not in str(error.value)


# --- notebooks (B07) ----------------------------------------------------------------------------

def test_b07_notebook_is_read_as_cells_without_base64(corpus):
    document = load_document(corpus / "bugs" / "B07-notebook" / "repo")
    assert document.warnings == []  # not "skipped (minified)"
    [notebook] = [s for s in document.segments if s.label == "analysis.ipynb"]
    assert "# Churn analysis" in notebook.text and "CHURN_THRESHOLD = 0.37" in notebook.text
    assert "[image/png output omitted]" in notebook.text
    assert "iVBORw0KGgo" not in notebook.text and '"cell_type"' not in notebook.text


def test_notebook_outputs_are_trimmed_and_errors_named(tmp_path):
    import json

    cells = [{"cell_type": "code", "execution_count": 3, "source": ["for i in range(9999):\n", "    print(i)"],
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "".join(f"{i}\n" for i in range(9999))},
                          {"output_type": "error", "ename": "KeyError", "evalue": "'tenure'", "traceback": []}]}]
    (tmp_path / "loop.ipynb").write_text(json.dumps({"nbformat": 4, "metadata": {}, "cells": cells}))
    text = load_document(tmp_path / "loop.ipynb").segments[0].text
    assert text.startswith("In [3]:\n```python\nfor i in range(9999):")
    assert "more characters of output]" in text and len(text) < 2400
    assert text.endswith("KeyError: 'tenure'")


def test_broken_notebook_is_listed_not_fatal(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "ok.py").write_text("print('ok')\n")
    document = load_repository(tmp_path, use_git=False)
    assert [s.label for s in document.segments] == ["ok.py"]
    assert document.warnings == ["skipped (unreadable notebook: not valid JSON (Expecting value at line 1)): broken.ipynb"]


# --- generated and vendored files ---------------------------------------------------------------

GENERATED_TREE = {
    ".gitattributes": "docs/api.json linguist-generated\nthird/** linguist-vendored\nCargo.lock linguist-generated=false\n",
    "docs/api.json": '{"paths": {}}\n', "src/app.py": "x = 1\n", "uv.lock": "version = 1\n",
    "Cargo.lock": "version = 3\n", "web/yarn.lock": "# yarn lockfile v1\n", "third/lib/v.py": "v = 1\n",
}
GENERATED_WARNING = ("skipped (generated or vendored; the setting include_generated_files reads them): "
                     "docs/api.json, third/lib/v.py, uv.lock, web/yarn.lock")


@pytest.mark.parametrize("use_git", [False, pytest.param(True, marks=needs_git)], ids=["pathspec", "git"])
def test_lock_files_and_linguist_marked_files_are_left_out_with_a_warning(tmp_path, use_git):
    for rel, content in GENERATED_TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    if use_git:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    document = load_repository(tmp_path, use_git=use_git)
    assert segment_paths(document) == [".gitattributes", "Cargo.lock", "src/app.py"]  # =false keeps Cargo.lock
    assert document.warnings == [GENERATED_WARNING]
    everything = load_repository(tmp_path, use_git=use_git, include_generated=True)
    assert len(everything.segments) == len(GENERATED_TREE) and everything.warnings == []


def test_include_generated_is_a_setting_that_reaches_the_loader(tmp_path):
    from engine.settings import EngineSettings

    (tmp_path / "poetry.lock").write_text("[[package]]\n")
    (tmp_path / "main.py").write_text("print(1)\n")
    settings = EngineSettings.from_dict({"include_generated_files": True})
    document = load_document(tmp_path, include_generated=settings.include_generated_files)
    assert segment_paths(document) == ["main.py", "poetry.lock"]
    assert segment_paths(load_document(tmp_path)) == ["main.py"]


# --- a folder below a repository that ignores it (B23) ------------------------------------------

def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


@pytest.fixture
def b23(corpus, tmp_path):
    if not HAS_GIT:
        pytest.skip("git is not installed")
    script = next((corpus / "bugs").glob("B23-*")) / "build.sh"
    subprocess.run(["sh", str(script), str(tmp_path)], check=True, timeout=60)
    return tmp_path


def test_b23_folder_below_a_home_repository_that_ignores_everything_is_read(b23):
    document = load_document(b23 / "home" / "projects" / "notes")
    assert segment_paths(document) == ["minutes.txt", "tool.py"]
    assert "MARKER-NOTES" in document.render() and "MARKER-CODE" in document.render()
    assert document.warnings == [repo.OUTER_IGNORED]


def test_b23_folder_inside_an_ignored_build_folder_is_read(b23):
    document = load_document(b23 / "proj" / "build-out" / "docs")
    assert segment_paths(document) == ["index.md"] and document.warnings == [repo.OUTER_IGNORED]


@needs_git
def test_outer_rules_that_hide_everything_inside_the_folder_do_not_hide_it(tmp_path):
    """The folder itself is not ignored, only all it holds (`logs/*`): still read, with a note."""
    git("init", "-q", str(tmp_path))
    (tmp_path / ".gitignore").write_text("logs/*\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run.txt").write_text("run finished\n")
    document = load_document(tmp_path / "logs")
    assert segment_paths(document) == ["run.txt"] and document.warnings == [repo.OUTER_IGNORED]


@needs_git
def test_an_ignored_folder_keeps_its_own_ignore_rules_and_tracked_files(tmp_path):
    home = tmp_path / "home"
    notes = home / "notes"
    notes.mkdir(parents=True)
    git("init", "-q", str(home))
    (home / ".gitignore").write_text("*\n")
    (notes / ".gitignore").write_text("*.tmp\n")
    for name in ("a.txt", "b.tmp", "tracked.md"):
        (notes / name).write_text(f"{name} text\n")
    git("-C", str(home), "add", "-f", "notes/tracked.md")
    document = load_document(notes)
    assert segment_paths(document) == [".gitignore", "a.txt", "tracked.md"]
    assert "ignored by .gitignore: b.tmp" in document.warnings


@needs_git
def test_a_subfolder_the_outer_repository_does_not_ignore_keeps_its_rules(tmp_path):
    git("init", "-q", str(tmp_path))
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("x = 1\n")
    (tmp_path / "src" / "debug.log").write_text("noise\n")
    document = load_document(tmp_path / "src")
    assert segment_paths(document) == ["app.py"] and repo.OUTER_IGNORED not in document.warnings


# --- a code folder without a .gitignore (issue 45.4) --------------------------------------------

def unzipped_project(root):
    """A project as a zip or a copy leaves it: no .gitignore, no .git; two hand-written modules, a
    tool with one pasted 5,600-character line, and what builds and generators left beside them."""
    files = {
        "src/pkg/__init__.py": "from pkg.core import area\n",
        "src/pkg/core.py": "def area(w, h):\n    return w * h\n",
        "tools/fixtures.py": "SAMPLE = '" + "ab" * 2800 + "'\n\ndef load():\n    return SAMPLE\n"
                             + "".join(f"\n\ndef check_{k}(x):\n    return x > {k}\n" for k in range(12)),
        "pkg.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: pkg\n",
        "pkg.egg-info/SOURCES.txt": "src/pkg/core.py\n",
        "dist/pkg-1.0/README": "pkg 1.0\n",
        "api/area_pb2.py": "# -*- coding: utf-8 -*-\nDESCRIPTOR = None\n",
        "gen/models.go": "// Code generated by sqlc. DO NOT EDIT.\n// versions:\n\npackage gen\n",
        "web/schema.ts": "/**\n * @generated SignedSource<<abc>>\n */\nexport type A = 1;\n",
        "package-lock.json": '{"lockfileVersion": 3}\n',
    }
    for k in range(40):  # an old `build/lib` copy of the package, and more of it
        files[f"build/lib/pkg/mod{k:02d}.py"] = f"def f{k}():\n    return {k}\n"
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    return root


def test_a_folder_without_gitignore_reads_only_the_hand_written_files(tmp_path):
    """Before: the 40 build/lib copies, the egg-info, the protobuf and generator-marked files were
    read whole (most of the attention), the long-lined tool was dropped whole, and each skip was
    its own warning line."""
    document = load_repository(unzipped_project(tmp_path), use_git=False)
    assert segment_paths(document) == ["src/pkg/__init__.py", "src/pkg/core.py", "tools/fixtures.py"]
    tool = next(s.text for s in document.segments if s.path == "tools/fixtures.py")
    assert "def load():" in tool and "[cut: 611 more characters]" in tool and "ab" * 2800 not in tool
    warnings = document.warnings
    assert "long line cut to 5,000 characters: line 1 (5,611): tools/fixtures.py" in warnings
    build = [w for w in warnings if w.startswith("skipped (build output, 43 files): ")]
    assert len(build) == 1 and build[0].endswith(" and 23 more")
    assert "skipped (generated code): api/area_pb2.py" in warnings
    assert "skipped (generated: marked in its first lines): gen/models.go" in warnings
    assert "skipped (generated: marked in its first lines): web/schema.ts" in warnings
    assert any(w.startswith("skipped (generated or vendored;") and "package-lock.json" in w for w in warnings)
    assert len(warnings) == 6, warnings  # one line per kind, not one per file
    everything = load_repository(tmp_path, use_git=False, include_generated=True)
    assert len(everything.segments) == 50


def test_linguist_generated_false_keeps_a_build_folder_in(tmp_path):
    (tmp_path / ".gitattributes").write_text("build/** linguist-generated=false\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "make.py").write_text("print('build script')\n")
    assert segment_paths(load_repository(tmp_path, use_git=False)) == [".gitattributes", "build/make.py"]
