"""A full-text index of a document's spans: SQLite FTS5, ranked by BM25.

Recall at book length starts here (`engine.session`): the question's words find the spans (pages,
or parts of long pages and files) that may answer it, and the session recalls those spans whole
from the archive. The same ranking cuts a document for the cloud (`engine.cloud.plan`). The words
find the page that answers far more often than the question's own attention does on the default
model (docs/BENCHMARKS.md §7).

Terms (`terms`): words in any script, lower-cased, after NFKC; identifiers are also split
(`parse_header_links` → parse, header, links; `HTTPDigestAuth` → http, digest, auth); CJK, Thai and
other scripts written without spaces are indexed as overlapping character bigrams (the usual
substitute for a word segmenter, as Lucene's CJK analyzer does), so a Chinese question finds a
Chinese section. FTS5's `porter` stemmer then folds English inflections (parses / parse).

An index is a cache of data derived from the document: stored beside the snapshot in the prefix
store, it carries a digest of its spans, and `TextIndex.open` refuses one whose digest differs or
that fails FTS5's own integrity check, so the caller rebuilds it (`load_or_build`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import sqlite3
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

INDEX_FORMAT = "halaman-spans-3"
SPAN_MAX_CHARS = 2400
"""Longest span in characters (about 600 tokens of English): most book pages are one span; a longer
page or file is split at blank lines, then at line ends."""

# Words that carry no topic: English function words and the words questions are phrased with.
STOPWORDS = frozenset(
    "a an the and or but not no nor of to in on at by for with from into onto about as is are was were be been "
    "being am do does did done has have had having it its this that these those there their them they then than "
    "he she his her him we our you your i me my what which who whom whose when where why how whether "
    "can could may might must shall should will would also some such only other each more most very just "
    "over under any all one two new see get let say use used using if so up out".split()
)

# Words a question uses to say *where* its answer is ("Which file defines …?", "On which page …?"):
# they are left out of the query, not of the index, because in a document they are ordinary words
# ("a file-like object") that would rank a span for the wrong reason.
QUESTION_WORDS = frozenset(
    "file files page pages document documents section sections chapter chapters "
    "define defines defined definition implement implements implemented implementation declare declares "
    "declared located contain contains mentioned".split()
)

# The document naming itself ("What does the book call …?", "Which classes does the library
# provide?"): it says where, not what, and the spans that say "book" most (a preface, a title page)
# would win for it. Only with a determiner, so "Which book does the author cite?" keeps its word.
_SELF_REFERENCE = re.compile(
    r"\b(?:the|this|that|your|its)\s+(?:book|paper|report|article|manual|guide|document|library|project|repository|"
    r"repo|package|code ?base|filing|thesis)\b", re.IGNORECASE)

_WORD = re.compile(r"\w+")
# Scripts written without spaces between words: CJK ideographs, kana, Hangul, Thai, Lao, Khmer, Myanmar.
_UNSPACED = re.compile(r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
                       r"\uac00-\ud7af\uf900-\ufaff]+")
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")

DEFINITION_WEIGHT = 3.0
"""BM25 weight of the `defs` column (names a span defines, from tree-sitter:
`engine.evidence.code_units`) against 1.0 for its text, so the file
that defines `TooManyRedirects` outranks the one that raises it (a code search engine's usual symbol
boost, as Zoekt and Sourcegraph rank symbol matches). Measured on the requests-dev questions:
docs/BENCHMARKS.md §7."""

def terms(text: str) -> list[str]:
    """The index terms of `text` in order (see the module docstring); stopwords and one-letter
    Latin words are left out, digits kept ("30", "10")."""
    text = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group()
        pos = 0
        for run in _UNSPACED.finditer(word):
            out.extend(_word_terms(word[pos:run.start()]))
            chars = run.group()
            out.extend([chars] if len(chars) == 1 else [chars[i:i + 2] for i in range(len(chars) - 1)])
            pos = run.end()
        out.extend(_word_terms(word[pos:]))
    return out


def _word_terms(word: str) -> list[str]:
    if not word:
        return []
    parts = [p for piece in word.split("_") for p in (_CAMEL.findall(piece) or [piece])]
    found = [word.lower()] if len(parts) != 1 else []
    found += [p.lower() for p in parts]
    return [w for w in dict.fromkeys(found) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]


def compounds(text: str) -> list[str]:
    """Adjacent words of `text` written as one ("pool size" → poolsize, "file name" → filename):
    code joins the words of a name that a question writes apart (`DEFAULT_POOLSIZE`)."""
    words = [w.lower() for w in _WORD.findall(unicodedata.normalize("NFKC", text))]
    return list(dict.fromkeys(a + b for a, b in zip(words, words[1:])
                              if a.isalpha() and b.isalpha() and len(a) > 2 and len(b) > 2
                              and a not in STOPWORDS and b not in STOPWORDS))


def split_spans(text: str, max_chars: int = SPAN_MAX_CHARS) -> list[tuple[int, int]]:
    """Character ranges `[(start, end)]` covering `text` in order, each at most `max_chars` long,
    cut at blank lines where possible, else at line ends, else hard."""
    if len(text) <= max_chars:
        return [(0, len(text))]
    spans, start = [], 0
    while len(text) - start > max_chars:
        window = text[start:start + max_chars]
        cut = window.rfind("\n\n")
        if cut < max_chars // 3:
            cut = window.rfind("\n")
        cut = start + (cut + 1 if cut >= max_chars // 3 else max_chars)
        spans.append((start, cut))
        start = cut
    spans.append((start, len(text)))
    return spans


def spans_digest(texts: Sequence[str], defs: Sequence[Sequence[str]] | None = None) -> str:
    """SHA-256 over the format, the spans' texts and the names they define: what an index built
    from them must carry."""
    digest = hashlib.sha256(INDEX_FORMAT.encode())
    for k, text in enumerate(texts):
        digest.update(b"\0" + text.encode("utf-8", "surrogatepass"))
        if defs is not None:
            digest.update(b"\1" + " ".join(defs[k]).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


class IndexDamaged(Exception):
    """A stored index is missing, damaged or built from other spans (rebuild it)."""


@dataclass(frozen=True)
class Hit:
    """One ranked span: its position in the list it was built from and its BM25 score (> 0)."""

    span: int
    score: float


class TextIndex:
    """An FTS5 index over a list of span texts. Build with `build`, reopen with `open`."""

    def __init__(self, db: sqlite3.Connection, n_spans: int) -> None:
        self._db = db
        self.n_spans = n_spans

    @classmethod
    def build(cls, texts: Sequence[str], path: Path | None = None,
              defs: Sequence[Sequence[str]] | None = None) -> TextIndex:
        """Index `texts` in memory (`path` None) or in the SQLite file `path`, written to a temp
        file in its folder and renamed into place (a crash never leaves half an index there).
        `defs[k]`: the names text k defines (its `defs` column; none when None). Raises
        sqlite3.Error / OSError when the file cannot be written."""
        target = ":memory:" if path is None else str(path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"))
        db = sqlite3.connect(target, check_same_thread=False)
        try:
            db.executescript(
                "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
                "CREATE VIRTUAL TABLE spans USING fts5(terms, defs, tokenize = 'porter unicode61 remove_diacritics 2');"
            )
            db.executemany("INSERT INTO spans (rowid, terms, defs) VALUES (?, ?, ?)",
                           ((i, " ".join(terms(t)), " ".join(terms(" ".join(defs[i]))) if defs is not None else "")
                            for i, t in enumerate(texts)))
            db.executemany("INSERT INTO meta VALUES (?, ?)",
                           [("digest", spans_digest(texts, defs)), ("n_spans", str(len(texts)))])
            db.commit()
            if path is None:
                return cls(db, len(texts))
            db.close()
            os.replace(target, path)
        except BaseException:
            db.close()
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(target)
            raise
        return cls.open(path, spans_digest(texts, defs))

    @classmethod
    def open(cls, path: Path, digest: str) -> TextIndex:
        """Open the index file `path`, which must carry `digest` (`spans_digest` of the spans it is
        expected to hold) and pass FTS5's integrity check. Raises IndexDamaged otherwise."""
        if not path.is_file():
            raise IndexDamaged(f"no text index at {path.name}")
        try:
            db = sqlite3.connect(path, check_same_thread=False)  # FTS5's integrity check is an INSERT: not read-only
        except sqlite3.Error as error:
            raise IndexDamaged(f"text index unreadable ({error})") from None
        try:
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("digest") != digest:
                raise IndexDamaged("text index was built from other spans")
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise IndexDamaged("text index damaged (SQLite quick check failed)")
            db.execute("INSERT INTO spans (spans, rank) VALUES ('integrity-check', 1)")  # index vs. content
            return cls(db, int(meta["n_spans"]))
        except (sqlite3.Error, KeyError, ValueError) as error:
            db.close()
            raise IndexDamaged(f"text index damaged ({error})") from None
        except IndexDamaged:
            db.close()
            raise

    def search(self, query: str, limit: int = 8) -> list[Hit]:
        """The best `limit` spans for the words of `query` but its QUESTION_WORDS and the
        document's name for itself ("the book"; unless it has no others), best first (BM25, k1 = 1.2, b = 0.75; Robertson & Zaragoza 2009; the names a
        span defines weigh DEFINITION_WEIGHT times its text). Empty when no term of the query
        occurs in any span."""
        asked = _SELF_REFERENCE.sub(" ", query)
        if not terms(asked):
            asked = query
        every = list(dict.fromkeys(terms(asked)))
        words = [w for w in every if w not in QUESTION_WORDS] or every
        if not words:
            return []
        words += [c for c in compounds(asked) if c not in words]
        match = " OR ".join(f'"{w}"' for w in words)  # quoted: a question is never FTS5 syntax
        rows = self._db.execute("SELECT rowid, -bm25(spans, 1.0, ?) AS score FROM spans WHERE spans MATCH ? "
                                "ORDER BY score DESC LIMIT ?", (DEFINITION_WEIGHT, match, limit)).fetchall()
        return [Hit(int(rowid), float(score)) for rowid, score in rows]

    def rows_with(self, term: str) -> list[int]:
        """Rows whose text holds the one term `term` (as `terms` gives it, matched after the
        index's stemming), in no particular order."""
        quoted = term.replace('"', '""')
        return [int(row) for (row,) in self._db.execute("SELECT rowid FROM spans WHERE spans MATCH ?", (f'terms : "{quoted}"',))]

    def close(self) -> None:
        """Close the connection (the file stays)."""
        self._db.close()


def load_or_build(texts: Sequence[str], path: Path | None,
                  defs: Sequence[Sequence[str]] | None = None) -> tuple[TextIndex, bool]:
    """The index of `texts` (and the names `defs` they define): opened from `path` when it is there
    and intact, else (re)built there (in memory when `path` is None, or when the file cannot be
    written). Returns (index, rebuilt)."""
    if path is not None:
        with contextlib.suppress(IndexDamaged):
            return TextIndex.open(path, spans_digest(texts, defs)), False
        with contextlib.suppress(OSError, sqlite3.Error):
            path.unlink(missing_ok=True)
            return TextIndex.build(texts, path, defs), True
    return TextIndex.build(texts, None, defs), True


def rank(texts: Sequence[str], query: str, defs: Sequence[Sequence[str]] | None = None) -> list[float]:
    """BM25 score of every text for `query` (0 where no term matches), through an in-memory index."""
    index = TextIndex.build(texts, None, defs)
    try:
        scores = [0.0] * len(texts)
        for hit in index.search(query, limit=len(texts)):
            scores[hit.span] = hit.score
        return scores
    finally:
        index.close()
