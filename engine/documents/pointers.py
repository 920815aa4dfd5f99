"""Pointer files of large-file tools: what a clone holds in place of a large file when its content
was not fetched (B30 in docs/REAL_WORLD_INPUTS.md: a clone without git-lfs installed).

- Git LFS (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md): `version
  https://git-lfs.github.com/spec/v1`, optional `ext-N-name sha256:…` lines, `oid sha256:<64 hex>`,
  `size <bytes>`; under 1,024 bytes.
- git-annex, unlocked files (https://git-annex.branchable.com/internals/): one line
  `/annex/objects/<key>`, the key being `BACKEND-sSIZE--NAME` ("SHA256E-s1048576--9f86….pdf").
Read as content, a pointer would tell the model that `report.pdf` says "version https://git-lfs…":
it is left out, and the user told which command fetches the real file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_POINTER_BYTES = 1024
"""The LFS spec: "Pointer files must be less than 1024 bytes in size"; annex keys are shorter."""


@dataclass(frozen=True)
class PointerKind:
    """tool: "Git LFS" or "git-annex"; fetch: the command that downloads the content."""

    tool: str
    fetch: str


GIT_LFS = PointerKind("Git LFS", "git lfs pull")
GIT_ANNEX = PointerKind("git-annex", "git annex get")
KINDS = (GIT_LFS, GIT_ANNEX)

# git-lfs also accepts the pre-release spec URL (hawser) when it reads a pointer; it writes LF line
# ends, but a checkout with core.autocrlf turns them into CRLF.
_LFS = re.compile(
    rb"version https://(?:git-lfs\.github\.com/spec/v1|hawser\.github\.com/spec/v1)\r?\n"
    rb"(?:ext-\d+-[\w.-]+ sha256:[0-9a-f]{64}\r?\n)*"
    rb"oid sha256:[0-9a-f]{64}\r?\n"
    rb"size \d+(?:\r?\n)?")
_ANNEX = re.compile(rb"/annex/objects/[A-Z0-9]+(?:-[a-zA-Z]\d+)*--[^\s/]+(?:\r?\n)?")


def pointer_kind(data: bytes) -> PointerKind | None:
    """Which tool's pointer the whole of `data` (a file's bytes) is, or None for any other file."""
    if len(data) >= MAX_POINTER_BYTES:
        return None
    if _LFS.fullmatch(data):
        return GIT_LFS
    return GIT_ANNEX if _ANNEX.fullmatch(data) else None
