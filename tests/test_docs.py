"""The docs stand alone: what the code's comments point at is in the repository.

Test names, docstrings and comments name test-corpus cases by id (P05, S01, R04, B07, L04, T06); the
corpus itself lives outside the repository, so each id must be explained in docs/CORPUS.md. And
every `docs/*.md` a comment or the README names must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASE_ID = re.compile(r"\b(?:P(?:0[1-9]|1[0-6])|S0[1-6]|R0[1-8]|B(?:0[1-9]|1[01])|L0[1-6]|T0[1-7])\b")
DOC_LINK = re.compile(r"(?<![\w/])docs/([A-Z_]+\.md)\b")  # the project's docs are named in capitals


def sources() -> list[Path]:
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for folder in ("engine", "app", "tests", "bench", "installer"):
        files += sorted((REPO / folder).rglob("*.py"))
    return files


def test_every_case_id_used_is_explained_in_corpus_md():
    corpus_md = (REPO / "docs" / "CORPUS.md").read_text(encoding="utf-8")
    explained = set(re.findall(r"^\| ([A-Z]\d\d) \|", corpus_md, flags=re.M))
    used = {}
    for path in sources():
        if path.name == "CORPUS.md":
            continue
        for case in CASE_ID.findall(path.read_text(encoding="utf-8")):
            used.setdefault(case, path.relative_to(REPO).as_posix())
    assert used, "the pattern found no case ids at all"
    assert {case: where for case, where in used.items() if case not in explained} == {}


def test_no_pointer_to_files_outside_the_repository():
    outside = ("CASES.md", "corpus/pdf/README", "corpus/repo/", "ARCHITECTURE \"", "(ARCHITECTURE")
    found = [f"{path.relative_to(REPO)}: {marker}" for path in sources() if path != Path(__file__).resolve()
             for marker in outside if marker in path.read_text(encoding="utf-8")]
    assert found == []


def test_named_docs_exist():
    missing = {name for path in sources() for name in DOC_LINK.findall(path.read_text(encoding="utf-8"))
               if not (REPO / "docs" / name).exists()}
    assert missing == set()
