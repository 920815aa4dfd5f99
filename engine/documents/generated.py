"""Generated and vendored files in a repository: lock files, and what .gitattributes marks.

They are not the code a user asks about, and they are large: in the flask repository `uv.lock`
alone is 310k of its 1.47M characters (21 %). Like GitHub's linguist (which hides them from
language statistics and collapses them in diffs), Halaman leaves out by default:
- the well-known lock files (`LOCK_FILES`, by file name at any depth);
- every path whose `linguist-generated` or `linguist-vendored` attribute is set or true in
  `.gitattributes` (https://github.com/github-linguist/linguist/blob/main/docs/overrides.md);
  `linguist-generated=false` keeps a lock file in. git answers (`git check-attr`) in a work
  tree; otherwise the .gitattributes files are read with pathspec.
The setting `include_generated_files` reads them all.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pathspec

from engine.documents.git import run_git

LOCK_FILES = frozenset({
    "uv.lock", "poetry.lock", "Pipfile.lock", "pdm.lock", "pylock.toml", "conda-lock.yml",
    "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lock", "deno.lock",
    "Cargo.lock", "Gemfile.lock", "composer.lock", "go.sum", "go.work.sum", "flake.lock",
    "Podfile.lock", "Package.resolved", "mix.lock", "pubspec.lock", "packages.lock.json",
    "gradle.lockfile", "Manifest.toml", "Chart.lock", ".terraform.lock.hcl",
})
"""Dependency lock files: written by package managers, never by hand."""

ATTRIBUTES = ("linguist-generated", "linguist-vendored")


def generated_files(root: Path, files: list[str], *, use_git: bool) -> dict[str, str]:
    """Which of `files` (root-relative POSIX paths) are generated or vendored, each with why:
    "lock file", "linguist-generated" or "linguist-vendored". An attribute set to false wins
    over the lock-file name."""
    attributes = (_git_attributes(root, files) if use_git else None)
    if attributes is None:
        attributes = _file_attributes(root, files)
    found: dict[str, str] = {}
    for rel in files:
        values = attributes.get(rel, {})
        marked = next((name for name in ATTRIBUTES if values.get(name) is True), None)
        if marked is not None:
            found[rel] = marked
        elif rel.rsplit("/", 1)[-1] in LOCK_FILES and values.get("linguist-generated") is not False:
            found[rel] = "lock file"
    return found


def _truth(value: str) -> bool | None:
    """An attribute's state as git prints it ("set", "unset", "unspecified", or a value)."""
    if value in ("set", "true", "1"):
        return True
    if value in ("unset", "false", "0"):
        return False
    return None


def _git_attributes(root: Path, files: list[str]) -> dict[str, dict[str, bool | None]] | None:
    """`git check-attr` for every file; None when git is missing, fails or `root` is no work tree."""
    if not files:
        return {}
    out = run_git(root, "check-attr", "-z", "--stdin", *ATTRIBUTES,
                  input=b"".join(os.fsencode(rel) + b"\0" for rel in files))
    if out is None:
        return None
    fields = out.split(b"\0")
    result: dict[str, dict[str, bool | None]] = {}
    for index in range(0, len(fields) - 2, 3):  # path, attribute, state
        path, name, state = (os.fsdecode(field) for field in fields[index:index + 3])
        result.setdefault(path, {})[name] = _truth(state)
    return result


def _file_attributes(root: Path, files: list[str]) -> dict[str, dict[str, bool | None]]:
    """The two attributes from the listed .gitattributes files, without git: deeper files win over
    shallower ones and later lines over earlier ones, as in git."""
    rules = []  # (folder prefix, compiled pattern, attribute, state), in increasing precedence
    for rel in sorted((f for f in files if f.rsplit("/", 1)[-1] == ".gitattributes"), key=lambda f: f.count("/")):
        prefix = rel[: -len(".gitattributes")]
        try:
            if not stat.S_ISREG(os.lstat(root / rel).st_mode):
                continue  # a symlinked .gitattributes is not read, as git refuses one (2.32)
            lines = (root / rel).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            pattern, *tokens = line.split() or [""]
            if not pattern or pattern.startswith(("#", "!")):  # negative patterns are not allowed
                continue
            try:
                compiled = pathspec.GitIgnoreSpec.from_lines([pattern]).patterns[0]
            except ValueError:
                continue
            for token in tokens:
                name, state = _token(token)
                if name in ATTRIBUTES and compiled.regex is not None:
                    rules.append((prefix, compiled.regex, name, state))
    result: dict[str, dict[str, bool | None]] = {}
    for rel in files:
        for prefix, regex, name, state in rules:
            if rel.startswith(prefix):
                match = regex.match(rel[len(prefix):])
                # A pattern matching a folder does not apply to the files in it (gitattributes(5)).
                if match is not None and match.groupdict().get("ps_d") is None:
                    result.setdefault(rel, {})[name] = state
    return result


def _token(token: str) -> tuple[str, bool | None]:
    """"name" set, "-name" unset, "!name" unspecified, "name=value"."""
    if token.startswith("-"):
        return token[1:], False
    if token.startswith("!"):
        return token[1:], None
    name, equals, value = token.partition("=")
    return name, _truth(value) if equals else True
