"""Code repositories: every text file that git would show, one segment per file, in path order.
Word files, decks, workbooks, e-books, OpenDocument and RTF files among them are read by their
formats' readers (`engine.documents.formats`), each a segment of its units under their labels.

Which files: for a git work tree, git itself answers (`git ls-files --cached --others
--exclude-standard`), because only git implements its ignore rules exactly (corpus case R05:
libgit2 #7284, node-ignore #79). Without git, or outside a work tree, nested .gitignore files are
applied with pathspec, and an ignored directory is never entered (so a file under it cannot be
re-included, as in git). The corpus' generated fixture repository (cases R01-R06 in
docs/CORPUS.md) is the ground truth.

What is skipped, each listed in `Document.warnings`: vendored folders, symlinks (never followed:
R04), non-regular files, files over `plain.MAX_FILE_BYTES`, binary files, minified
files, empty files, files whose encoding cannot be told. Files in legacy encodings are decoded
with the code page charset-normalizer detects and flagged (`engine.documents.encoding`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from engine.documents.document import Document, NoTextFilesError, ProgressCallback, Segment
from engine.documents.generated import generated_files, marked_generated
from engine.documents.git import git_run, refusal, run_git, unreadable_folders
from engine.documents.names import display_name
from engine.documents.formats import TABLE_SUFFIXES, format_loader
from engine.documents.plain import CONVERTED_SUFFIXES, read_file
from engine.documents.pointers import KINDS as POINTER_KINDS
from engine.errors import Cancelled

VENDORED_DIRS = frozenset({
    "node_modules", "bower_components", "site-packages", "__pycache__", ".tox", ".venv",
    ".hg", ".svn",
})
"""Folder names skipped at any depth: installed third-party code or tool state, never authored."""

VENDORED_TOP_DIRS = frozenset({"vendor", "third_party", "Pods"})
"""Skipped only directly under the root (Go, Composer, Bundler, CocoaPods put them there). Deeper
ones are left to .gitignore: the fixture's a/vendor/ is re-included on purpose (libgit2 #7284)."""

MINIFIED_AVG_LINE_CHARS = 200
"""Average line length above which a file is minified (github/codeql PR #20940)."""

MINIFIED_MAX_LINE_CHARS = 5000
"""A line longer than this is cut to this length (Deslop #539: one 113,564 character line took
most of a scan's memory); a file of mostly such lines is minified (MINIFIED_AVG_LINE_CHARS)."""

HAND_WRITTEN_LINES = 20
"""A file with long lines on average but at least this many lines of ordinary length is code
written by hand with something pasted into it, not a minified bundle (issue 45: a module with one
5,600-character line was dropped whole)."""

GROUP_AFTER = 5
"""More skipped files than this of one kind are one warning line with their count and the first
IGNORED_LISTED names, so a folder of 600 build copies does not bury the one warning that matters."""

LINGUIST_KINDS = ("lock file", "linguist-generated", "linguist-vendored")
"""What `generated_files` reports that the one .gitattributes/lock-file warning line names."""

MARKED = "generated: marked in its first lines"

PROSE_SUFFIXES = frozenset({".md", ".markdown", ".txt", ".rst", ".adoc", ".tex", ".org"})
"""Not checked for minification: unwrapped paragraphs make long lines normal in prose."""

IGNORED_LISTED = 20
"""How many paths a one-line summary (.gitignore, generated files) names before "and N more"."""

MAX_FOLDER_DEPTH = 64
"""Files under more folders than this are left out, with a warning naming the folders (B26: a
folder nested 1,100 levels deep). Source trees go 10-20 deep (Java packages, monorepos); the
walk never recurses, so a deeper limit would cost time, not a crash."""

OUTER_IGNORED = ("the repository above this folder ignores it or everything in it (.gitignore): read with "
                 "this folder's own ignore rules only")


def load_repository(root: Path, *, progress: ProgressCallback | None = None,
                    cancel: threading.Event | None = None, use_git: bool = True,
                    include_generated: bool = False) -> Document:
    """Load every text file under the folder `root` (absolute, symlinks resolved).

    `use_git=False` forces the pathspec fallback (tests compare both). Lock files and files that
    .gitattributes marks linguist-generated or linguist-vendored are left out with one warning
    naming them, unless `include_generated` (`engine.documents.generated`). Progress counts files.
    Raises NoTextFilesError when nothing is readable, or Cancelled.
    """
    root = Path(os.path.realpath(root))
    listing = list_files(root, use_git=use_git)
    warnings: list[str] = list(listing.notes)
    if listing.too_deep:
        warnings.append(f"folders deeper than {MAX_FOLDER_DEPTH} levels left out: "
                        + _some([_shortened(folder) for folder in listing.too_deep]))
    if listing.ignored:
        warnings.append("ignored by .gitignore: " + _some(listing.ignored))
    skips = _Skips()
    if not include_generated:
        generated = generated_files(root, listing.files, use_git=listing.source == "git")
        listing.files = [rel for rel in listing.files if rel not in generated]
        marked = sorted(rel for rel, why in generated.items() if why in LINGUIST_KINDS)
        if marked:
            warnings.append("skipped (generated or vendored; the setting include_generated_files reads them): "
                            + _some(marked))
        for rel, why in sorted(generated.items()):
            if why not in LINGUIST_KINDS:
                skips.add(why, display_name(rel))
    segments: list[Segment] = []
    pointers: dict[str, list[str]] = {}  # "Git LFS pointer" -> paths
    vendored_seen: set[str] = set()
    total = len(listing.files)
    for done, rel in enumerate(listing.files):
        if cancel is not None and cancel.is_set():
            raise Cancelled("Reading the folder was cancelled.")
        if progress:
            progress(done, total)
        vendored = _vendored_dir(rel)
        if vendored is not None:
            if vendored not in vendored_seen:
                vendored_seen.add(vendored)
                skips.add("vendored", display_name(vendored) + "/")
            continue
        text, skipped, notes = _read_file(root, rel)
        name = display_name(rel)  # `rel` opens the file; `name` is what people and the model see
        if skipped in POINTER_PHRASES:
            pointers.setdefault(skipped, []).append(rel)
            continue
        if skipped is None and not include_generated and marked_generated(text):
            skipped = MARKED
        if skipped is not None:
            skips.add(skipped, name)
            continue
        warnings += [f"{note}: {name}" for note in notes]
        segments.append(Segment(text=text, label=name, page=None, path=name))
    warnings += skips.lines()
    if progress:
        progress(total, total)
    for phrase, rels in pointers.items():
        one = len(rels) == 1
        warnings.append(f"{phrase}{'' if one else 's'} left out, {'its' if one else 'their'} content was not "
                        f"downloaded (run `{POINTER_PHRASES[phrase].fetch}` to fetch it): {_some(rels)}")
    if not segments:
        raise NoTextFilesError(
            f"{display_name(root.name)}: no readable text files in this folder ({total} file{'' if total == 1 else 's'} found, none "
            "readable as text): choose a folder with source code or text files")
    return Document(title=display_name(root.name), source=str(root), kind="repo", segments=segments,
                    warnings=warnings)


POINTER_PHRASES = {f"{kind.tool} pointer": kind for kind in POINTER_KINDS}
"""`plain.read_text`'s skip phrase for each kind of pointer file (B30)."""


class _Skips:
    """Skipped files by kind, in the order first seen: one warning line per file, or one line per
    kind with its count when more than GROUP_AFTER ("skipped (build output, 412 files; …): …")."""

    def __init__(self) -> None:
        self.by_kind: dict[str, list[str]] = {}

    def add(self, kind: str, name: str) -> None:
        self.by_kind.setdefault(kind, []).append(name)

    def lines(self) -> list[str]:
        lines = []
        for kind, names in self.by_kind.items():
            if len(names) <= GROUP_AFTER:
                lines += [f"skipped ({kind}): {name}" for name in names]
            else:
                more = len(names) - IGNORED_LISTED
                lines.append(f"skipped ({kind}, {len(names):,} files): " + ", ".join(names[:IGNORED_LISTED])
                             + (f" and {more:,} more" if more > 0 else ""))
        return lines


def _some(paths: list[str]) -> str:
    """The first IGNORED_LISTED paths, then "and N more"."""
    more = len(paths) - IGNORED_LISTED
    return ", ".join(map(display_name, paths[:IGNORED_LISTED])) + (f" and {more} more" if more > 0 else "")


def _shortened(folder: str, max_chars: int = 60) -> str:
    """A deep folder's path cut in the middle: "d/d/d/…/d/"."""
    parts = folder.rstrip("/").split("/")
    return folder if len(folder) <= max_chars or len(parts) < 5 else "/".join([*parts[:3], "…", parts[-1]]) + "/"


@dataclass
class Listing:
    """Candidate files (repo-relative POSIX paths, sorted), ignored paths (folders end in /),
    folders left out for their depth (end in /), and notes for the warnings."""

    files: list[str]
    ignored: list[str] = field(default_factory=list)
    source: str = "gitignore"  # "git" when git answered
    too_deep: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def list_files(root: Path, *, use_git: bool = True) -> Listing:
    """Which paths under `root` an ingest considers: git's answer, else the pathspec fallback;
    files under more than MAX_FOLDER_DEPTH folders left out either way."""
    listing = _git_listing(root) if use_git else None
    if listing is None:
        listing = _walk_listing(root)
        refused = refusal(git_run(root, "rev-parse", "--is-inside-work-tree").stderr) if use_git else None
        if refused is not None:
            listing.notes.append(f"{refused}: read with its .gitignore files instead of git")
    deep = {"/".join(rel.split("/", MAX_FOLDER_DEPTH + 1)[:MAX_FOLDER_DEPTH + 1]) + "/"
            for rel in listing.files if rel.count("/") > MAX_FOLDER_DEPTH}
    if deep:
        listing.files = [rel for rel in listing.files if rel.count("/") <= MAX_FOLDER_DEPTH]
        listing.too_deep = sorted(set(listing.too_deep) | deep)
    return listing


def _git_listing(root: Path) -> Listing | None:
    """Ask git (`engine.documents.git.run_git`: nothing the folder's config names is run); None
    when git is missing, fails, or `root` is not in a work tree.

    A folder the user chose is not hidden by the repository above it (B23: a home folder under
    git whose .gitignore is `*`, a folder inside a repository's ignored build output): when that
    repository ignores `root`, or everything in it, the folder is walked with its own ignore
    files only (`_walk_listing`; files added with `git add -f` are on disk, so they are in it),
    and a note says so."""

    def run(*args: str) -> list[str] | None:
        out = run_git(root, *args)
        return None if out is None else [os.fsdecode(p) for p in out.split(b"\0") if p]

    where = run_git(root, "rev-parse", "--is-inside-work-tree", "--show-prefix")
    if where is None or not where.startswith(b"true\n"):
        return None
    below_top = bool(where.removeprefix(b"true\n").strip(b"\n"))
    # Exit 0: ignored. --no-index: by the rules alone, also when some files in it were added with -f.
    if below_top and run_git(root, "check-ignore", "-q", "--no-index", "--", ".") is not None:
        return _outer_ignored(root)
    listed = git_run(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    if listed.stdout is None:
        return None
    files = [os.fsdecode(p) for p in listed.stdout.split(b"\0") if p]
    if below_top and not files:
        return _outer_ignored(root)
    ignored = run("ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z")
    # --cached lists a conflicted path once per stage; a nested repository shows as "dir/".
    return Listing(files=sorted({p.rstrip("/") for p in files}),
                   ignored=_outermost(ignored or []), source="git", notes=_unreadable_notes(listed.stderr))


def _unreadable_notes(stderr: str) -> list[str]:
    """The warning for folders git could not open (their files are not in its answer), grouped
    by reason: "folder git cannot read left out (Permission denied): secret/; check its
    permissions"."""
    by_reason: dict[str, list[str]] = {}
    for folder, reason in unreadable_folders(stderr):
        by_reason.setdefault(reason, []).append(folder)
    notes = []
    for reason, folders in by_reason.items():
        one = len(folders) == 1
        notes.append(f"folder{'' if one else 's'} git cannot read left out ({reason}): {_some(folders)}; "
                     f"check {'its' if one else 'their'} permissions")
    return notes


def _outer_ignored(root: Path) -> Listing:
    """The walk of a folder whose outer repository ignores it, with a note saying so when it
    finds anything."""
    listing = _walk_listing(root)
    if listing.files:
        listing.notes.append(OUTER_IGNORED)
    return listing


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside another listed folder: ["b/", "b/vendor/"] -> ["b/"].

    Paths sharing a prefix are contiguous once sorted, so one pass suffices.
    """
    result: list[str] = []
    folder = None
    for path in sorted(paths):
        if folder is not None and path.startswith(folder):
            continue
        result.append(path)
        folder = path if path.endswith("/") else None
    return result


def _walk_listing(root: Path) -> Listing:
    """Walk `root` without following symlinks, applying nested .gitignore files like git, down to
    MAX_FOLDER_DEPTH folders (a stack, not recursion: B26)."""
    files: list[str] = []
    ignored: list[str] = []
    too_deep: list[str] = []
    unreadable_folders: list[str] = []
    base_specs = []
    exclude = _read_patterns(root / ".git" / "info" / "exclude")
    if exclude:
        base_specs.append(("", pathspec.GitIgnoreSpec.from_lines(exclude)))
    pending: list[tuple[Path, str, list[tuple[str, pathspec.GitIgnoreSpec]]]] = [(root, "", base_specs)]
    while pending:
        folder, prefix, specs = pending.pop()
        patterns = _read_patterns(folder / ".gitignore")
        if patterns:
            specs = [*specs, (prefix, pathspec.GitIgnoreSpec.from_lines(patterns))]
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            unreadable_folders.append(prefix.rstrip("/") or ".")
            continue
        for entry in entries:
            if entry.name == ".git":
                continue  # git's own data, never content
            rel = prefix + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)  # a symlink to a folder is a file here
            if _is_ignored(rel, is_dir, specs):
                ignored.append(rel + "/" if is_dir else rel)
            elif is_dir and rel.count("/") >= MAX_FOLDER_DEPTH:
                too_deep.append(rel + "/")
            elif is_dir:
                pending.append((Path(entry.path), rel + "/", specs))
            else:
                files.append(rel)
    # An unreadable folder is listed like a file, so that it shows up in the skip list.
    files.extend(unreadable_folders)
    return Listing(files=sorted(files), ignored=sorted(ignored), source="gitignore", too_deep=sorted(too_deep))


def _read_patterns(path: Path) -> list[str]:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return []  # git does not follow a symlinked .gitignore either (since 2.32)
        return git_patterns(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def git_patterns(text: str) -> list[str]:
    """The lines of a .gitignore as git reads them (gitignore(5)), written so pathspec agrees.

    git removes a line's CR and its trailing spaces unless escaped ("foo\\ "), and keeps any
    other trailing whitespace: "*.log<TAB>" matches only names ending in a tab. pathspec strips
    all trailing whitespace, so a kept character is put in brackets ("*.log[\t]"). A line pathspec
    cannot compile (a trailing backslash) is dropped: git ignores it too.
    """
    patterns = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        body = line.rstrip(" ")
        if body != line and body.endswith("\\"):
            body += " "  # an escaped space is kept
        kept = len(body) - len(body.rstrip())
        if kept and not body.endswith("\\ "):
            body = body[:-kept] + "".join(f"[{char}]" for char in body[-kept:])
        if not body or body.startswith("#"):
            continue
        try:
            pathspec.GitIgnoreSpec.from_lines([body])
        except ValueError:  # GitIgnorePatternError
            continue
        patterns.append(body)
    return patterns


def _is_ignored(rel: str, is_dir: bool, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
    """git's verdict for one path: the deepest .gitignore with a matching pattern decides, and
    within a file the last matching pattern wins."""
    for prefix, spec in reversed(specs):
        relative = rel[len(prefix):]
        verdict = None
        for pattern in spec.patterns:
            if pattern.include is not None and _matches_itself(pattern.regex, relative, is_dir):
                verdict = pattern.include
        if verdict is not None:
            return verdict
    return False


def _matches_itself(regex: re.Pattern[str], path: str, is_dir: bool) -> bool:
    """Whether a pathspec pattern matches `path` itself, not merely a folder above it.

    pathspec's regexes also match everything under a matched folder (group "ps_d"), and check
    "foo/**" as matching "foo/" itself; git does neither. Since ignored folders are never entered,
    only a match on the path itself may count, else "foo/**" + "!foo/keep.txt" or "*" + "!*/" +
    "!*.py" give other answers than git (tests/test_documents_repo.py compares with git).
    """
    if is_dir:
        for match in regex.finditer(path + "/"):
            if match.end() == len(path) + 1 and match.groupdict().get("ps_d") is not None:
                return True
    match = regex.search(path)
    return match is not None and match.groupdict().get("ps_d") is None


def _vendored_dir(rel: str) -> str | None:
    """The vendored folder `rel` lies in ("node_modules", "web/node_modules"), or None."""
    parts = rel.split("/")[:-1]
    if parts and parts[0] in VENDORED_TOP_DIRS:
        return parts[0]
    for depth, part in enumerate(parts):
        if part in VENDORED_DIRS:
            return "/".join(parts[:depth + 1])
    return None


def _read_file(root: Path, rel: str) -> tuple[str, str | None, list[str]]:
    """(text, skip reason or None, notes such as "decoded with fallback (cp1252)")."""
    path = root / rel
    try:
        info = os.lstat(path)
    except OSError:
        return "", "missing: listed by git but not on disk", []
    if stat.S_ISLNK(info.st_mode):
        return "", _symlink_reason(path, root), []
    if stat.S_ISDIR(info.st_mode):
        return "", "folder: git submodule, nested repository or unreadable folder", []
    if not stat.S_ISREG(info.st_mode):
        return "", "not a regular file", []
    if not _inside(os.path.realpath(path), root):
        return "", "outside the folder", []  # defensive: a listing never goes through links
    if path.suffix.lower() not in TABLE_SUFFIXES and (loader := format_loader(path)) is not None:
        return _read_format(loader, path, rel)
    result = read_file(path)
    if result.skipped is not None:
        return "", result.skipped, []
    # A notebook's JSON or a page's HTML is not its text: never "minified" (B07, B17).
    suffix = path.suffix.lower()
    if suffix in CONVERTED_SUFFIXES or suffix in PROSE_SUFFIXES:
        return result.text, None, result.notes
    if _minified(result.text):
        return "", "minified", []
    text, cut = _long_lines_cut(result.text)
    return text, None, [*result.notes, *cut]


def _read_format(loader, path: Path, rel: str) -> tuple[str, str | None, list[str]]:
    """A Word file, deck, workbook, e-book, OpenDocument or RTF file in the folder, read by its
    format's reader (`engine.documents.formats`) instead of skipped as binary: its units one after
    another, each under its label ("[slide 2]"), as `_read_file` returns them. A file its reader
    refuses (encrypted, damaged, too large unpacked) is skipped with the reader's one-line reason."""
    from engine.errors import HalamanError

    try:
        document = loader(path, display_name(rel))
    except HalamanError as exc:
        return "", f"unreadable ({exc})", []
    text = "\n\n".join(f"[{segment.label}]\n{segment.text}" for segment in document.segments)
    return (text, None, []) if text.strip() else ("", "empty", [])


def _minified(text: str) -> bool:
    """Long lines on average and few lines of ordinary length: a bundle (a licence comment and one
    line of code) or a data blob. A hand-written module with one pasted blob has dozens of ordinary
    lines: it is kept and the blob cut (`_long_lines_cut`)."""
    lines = text.split("\n")
    if len(text) / len(lines) <= MINIFIED_AVG_LINE_CHARS:
        return False
    ordinary = sum(1 for line in lines if 0 < len(line.strip()) <= MINIFIED_AVG_LINE_CHARS)
    return ordinary < HAND_WRITTEN_LINES


def _long_lines_cut(text: str) -> tuple[str, list[str]]:
    """`text` with each line over MINIFIED_MAX_LINE_CHARS cut to that length and marked, and a note
    naming them ("long line cut to 5,000 characters: line 12 (5,600)"): a hand-written file with
    one pasted blob keeps its code."""
    lines = text.split("\n")
    long = [k for k, line in enumerate(lines) if len(line) > MINIFIED_MAX_LINE_CHARS]
    if not long:
        return text, []
    shown = ", ".join(f"line {k + 1} ({len(lines[k]):,})" for k in long[:3]) + (f" and {len(long) - 3} more" if len(long) > 3 else "")
    for k in long:
        lines[k] = lines[k][:MINIFIED_MAX_LINE_CHARS] + f" … [cut: {len(lines[k]) - MINIFIED_MAX_LINE_CHARS:,} more characters]"
    return "\n".join(lines), [f"long line{'s' if len(long) > 1 else ''} cut to {MINIFIED_MAX_LINE_CHARS:,} characters: {shown}"]


def _inside(real: str, root: Path) -> bool:
    root_text = str(root)
    return real == root_text or real.startswith(root_text.rstrip(os.sep) + os.sep)


def _symlink_reason(path: Path, root: Path) -> str:
    """Why a symlink is not read; the link is never followed for content (R04: a
    committed link to ~/.ssh/id_rsa must not reach the model)."""
    try:
        target = os.path.realpath(path, strict=True)
    except FileNotFoundError:
        return "dangling symlink"
    except OSError as exc:
        return "symlink loop" if exc.errno == errno.ELOOP else "unreadable symlink"
    if not _inside(target, root):
        return "symlink pointing outside the folder"
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return "unreadable symlink"
    if stat.S_ISDIR(mode):
        return "symlink to a folder"
    if not stat.S_ISREG(mode):
        return "symlink to a device or special file"
    return f"symlink to {Path(target).relative_to(root).as_posix()}"
