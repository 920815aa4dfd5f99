"""Run git on a folder the user opened without running anything that folder names (B12).

git reads programs to run out of the repository's own `.git/config`: `core.fsmonitor` is run by
every command that reads the index (`git ls-files`, `git check-attr`), hooks, clean/smudge filters,
diff drivers, pagers, credential helpers and `core.sshCommand` by others. `git clone` never copies
a repository's config, but a zip, a copied work tree or a backup carries it, and opening such a
folder ran its command (docs/SECURITY.md; the same hole was fixed in editors and agents, e.g.
mistralai/mistral-vibe #942, starship/starship #3981, atlassian/atlascode #1918).

Every git call goes through `run_git`, which:
- puts `-c` overrides first (command-line config wins over every config file, git-config(1)
  "CONFIGURATION FILE", scopes) that turn each command-bearing setting off (`SAFE_CONFIG`);
- passes `--no-pager` and `--no-optional-locks` (no opportunistic index write, so no
  `post-index-change` hook and no untracked-cache rewrite);
- starts git with none of the caller's `GIT_*` variables (a Halaman started from a git hook has
  `GIT_DIR` set, which would list another repository) and with `GIT_CONFIG_NOSYSTEM=1`,
  `GIT_TERMINAL_PROMPT=0`, `GIT_NO_LAZY_FETCH=1` (git >= 2.45: a partial clone never fetches
  a missing object), `GIT_ASKPASS` / `SSH_ASKPASS` empty;
- uses only commands that read the index and the work tree's ignore and attribute files, never
  file contents: filters and textconv drivers have nothing to run on even where a setting
  names one per driver (`filter.<name>.clean`), which `-c` cannot reset by pattern.
tests/test_repo_safety.py plants every kind and checks that none runs and the listing is unchanged.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engine.documents.names import display_name

GIT_TIMEOUT_S = 60.0

SAFE_CONFIG = (
    "core.fsmonitor=false",            # a command run on every index read (B12)
    "core.useBuiltinFSMonitor=false",  # Git for Windows' older name for the built-in daemon
    "core.hooksPath=/dev/null",        # hooks are looked up in a folder that holds none
    "core.untrackedCache=false",       # would rewrite the index
    "core.pager=cat",
    "core.editor=false",
    "core.askPass=",
    "core.sshCommand=false",           # ssh, if anything ever asked for the network
    "credential.helper=",              # empty resets the list of helpers (gitcredentials(7))
    "diff.external=",
    "protocol.allow=never",            # no transport at all: no fetch, no lazy fetch, no ext::
    "safe.bareRepository=explicit",    # a folder that is itself a bare repository is not used
)
"""`-c` overrides given before every command (git-config(1)); each names a setting that runs a
program or that would make a read-only listing write."""

_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "LC_ALL": "C",
}


def git_executable() -> str | None:
    """The git program in an absolute folder of PATH, or None when git is not installed.

    Relative PATH entries (".", "bin") are skipped, and so is the current folder that Python 3.11's
    `shutil.which` searches first on Windows: Halaman may be started inside the folder it opens,
    and a `git` or `git.exe` there is the folder's program, not git."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(folder):
            continue
        for name in _GIT_NAMES:
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    return None


_GIT_NAMES = ("git.exe", "git") if os.name == "nt" else ("git",)


def git_command(root: Path, *args: str) -> list[str] | None:
    """The argument list that runs `git args` in `root` with every folder-named command off;
    None when git is not installed."""
    git = git_executable()
    if git is None:
        return None
    overrides = [item for setting in SAFE_CONFIG for item in ("-c", setting)]
    return [git, *overrides, "--no-pager", "--no-optional-locks", "-C", str(root), *args]


def git_environment() -> dict[str, str]:
    """The environment git runs in: the caller's without any `GIT_*` variable, plus `_ENV`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GIT_")}
    env.update(_ENV)
    return env


def run_git(root: Path, *args: str, input: bytes | None = None) -> bytes | None:  # noqa: A002 - subprocess's name
    """stdout of `git args` run in the folder `root`, or None when git is missing, fails, exits
    non-zero or takes longer than GIT_TIMEOUT_S. Never raises for git's sake."""
    return git_run(root, *args, input=input).stdout


@dataclass(frozen=True)
class GitRun:
    """What one git command gave: stdout (None when git is missing, failed, exited non-zero or
    timed out) and its stderr as text (warnings such as an unreadable folder; "" when none)."""

    stdout: bytes | None
    stderr: str = ""


def git_run(root: Path, *args: str, input: bytes | None = None) -> GitRun:  # noqa: A002 - subprocess's name
    """`run_git` with git's stderr kept: git exits 0 after leaving out a folder it cannot open,
    and says so only there. Never raises for git's sake."""
    command = git_command(root, *args)
    if command is None:
        return GitRun(None)
    try:
        done = subprocess.run(command, input=input, capture_output=True, env=git_environment(),
                              stdin=None if input is not None else subprocess.DEVNULL,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return GitRun(None)
    stderr = done.stderr.decode("utf-8", "replace")
    return GitRun(done.stdout if done.returncode == 0 else None, stderr)


_UNREADABLE = re.compile(r"^warning: could not open directory '(.+)': (.+)$", re.MULTILINE)


def unreadable_folders(stderr: str) -> list[tuple[str, str]]:
    """(folder relative to where git ran, ending in "/"; the system's reason) for each folder
    that `git ls-files --others` could not open (git 2.x: "warning: could not open directory
    'secret/': Permission denied"; the folder's files are then missing from its answer)."""
    return [(folder if folder.endswith("/") else folder + "/", reason.strip())
            for folder, reason in _UNREADABLE.findall(stderr)]


def refusal(stderr: str) -> str | None:
    """Why git refused a folder that is (in) a repository, in a user's words, or None when it
    did not (no repository there is not a refusal). git >= 2.35.2 refuses a repository owned by
    another user ("detected dubious ownership", CVE-2022-24765); a damaged .git (a .git file
    pointing at a folder that is gone, a moved worktree) gives another "fatal:" line, passed on."""
    if "dubious ownership" in stderr:
        return ("git refuses this folder: its repository belongs to another user (\"dubious ownership\"; "
                "git's safe.directory setting allows it)")
    for line in stderr.splitlines():
        # "not a git repository (or any of the parent directories)" is no repository at all;
        # "not a git repository: /old/path" is a .git file pointing at a folder that is gone.
        if line.startswith("fatal:") and "or any of the parent directories" not in line:
            # The line quotes the folder's own .git file: control characters written as escapes.
            said = display_name(line.removeprefix("fatal:").strip()[:200])
            return f"git cannot read this folder's repository ({said})"
    return None
