"""The public document-QA sets of bench/public_qa.py: where they come from, how the cache is filled,
and where each question's evidence lies in the document as the engine reads it.

Sets (docs/PUBLIC_QA.md has the sources, commits and licences):
  pdfqa-research  pdfQA's synthetic set over two arXiv papers whose PDFs its repository commits
                  (tobischimanski/pdfQA, syn-pdfQA): 71 questions, evidence as the LaTeX source
                  paragraphs the question was written from; located on a PDF page by its words.
  qasper-pdf,     ten QASPER papers (allenai/qasper train split, as committed in
  qasper-docx     rajsr-p/qasper-personal), full text by section: rendered here as a PDF (Qt's
                  QTextDocument printed by QPdfWriter, A4, headings at their depth) and as a .docx
                  with one heading per section (the engine reads a .docx as one unit per heading,
                  so there a section plays the part of a page); evidence as the annotators'
                  paragraphs.
  emanual-s10,    the E-Manual QA samples (abhi1nandy2/EMNLP-2021-Findings, data/): 50 questions
  emanual-tv      each on a Samsung Galaxy S10 user manual (451 sections) and a Samsung Smart TV
                  and remote manual (261 sections), whose section texts the repository commits;
                  rendered as PDFs the same way; evidence as the experts' answer text, located on
                  the pages by its words.

Fill the cache once from clones of the three repositories (bare or not; Qt renders the PDFs):
    python bench/public_qa.py --fill-cache PATH/TO/pdfQA PATH/TO/qasper-personal PATH/TO/EMNLP-2021-Findings
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PDFQA = {"repo": "tobischimanski/pdfQA", "commit": "815f5ae6b0f64bcefe34f61a927ee7a09f7c14f6",
         "papers": ("2510.22211v1", "2510.22218v1"),
         "pdf": "syn-pdfQA/01.2_Input_Files_PDF/research articles/{id}.pdf",
         "questions": "syn-pdfQA/05_Difficulty_Filtered_Question_Answer_Data/research articles/{id}_cfQA_gpt-4o-mini-2024-07-18.json"}
QASPER = {"repo": "rajsr-p/qasper-personal", "commit": "d40559b9f8468dc3c94620503a9d83075df07016",
          "file": "qasper-original-sample.json"}
EMANUAL = {"repo": "abhi1nandy2/EMNLP-2021-Findings", "commit": "2ea1edfdaf0f4fa09ed89f46d0ea1d46b136ff92",
           "manuals": {"s10": ("data/s10_manual_corpus.json", "data/s10_50_questions.csv", "Galaxy S10 user manual"),
                       "tv": ("data/smart_tv_remote_manual_corpus.json", "data/smart_tv_remote_50_questions.csv",
                              "Smart TV and Smart Remote e-manual")}}
FLOAT = "FLOAT SELECTED:"
MIN_SHARE = 0.35
"""A LaTeX source paragraph is on the pages that together hold this share of its word trigrams, or on none
(an equation alone has too few words to place)."""
PART_SHARE = 0.2
"""A page holding this share of a source paragraph's trigrams holds part of it."""
FULL_SHARE = 0.8
"""A page holding this share of a passage's trigrams holds all of it (the rest: line breaks,
hyphenation, a formula's words)."""


@dataclass
class Question:
    """One question: `document` (a file name in the cache folder), its `kind` of evidence ("text",
    "table/figure", "manual"), and `evidence`, (unit index, char start, char end) ranges in the
    document's segments; a range (i, 0, len) stands for the whole unit (a PDF page). `passages`:
    for evidence given as whole pages, the passages themselves where their text is found exactly
    on the page (empty when none is)."""

    set: str
    document: str
    q: str
    kind: str
    qid: str = ""
    shown: bool = True  # whether the question's text may be written to the results (its set's licence)
    evidence: list[tuple[int, int, int]] = field(default_factory=list)
    passages: list[tuple[int, int, int]] = field(default_factory=list)  # on a PDF page, where found exactly


def _show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, check=True).stdout


def fill_cache(folder: Path, pdfqa_repo: Path, qasper_repo: Path, emanual_repo: Path) -> None:
    """Write the sets' documents and questions under `folder` from the three repositories' pinned
    commits: pdfqa/<id>.pdf and .json; qasper/<id>.pdf, <id>.docx and qasper.json; emanual/<name>.pdf
    and <name>.csv. Raises CalledProcessError when a repository lacks the commit or a file."""
    (folder / "pdfqa").mkdir(parents=True, exist_ok=True)
    for paper in PDFQA["papers"]:
        (folder / "pdfqa" / f"{paper}.pdf").write_bytes(_show(pdfqa_repo, PDFQA["commit"], PDFQA["pdf"].format(id=paper)))
        (folder / "pdfqa" / f"{paper}.json").write_bytes(_show(pdfqa_repo, PDFQA["commit"], PDFQA["questions"].format(id=paper)))
    (folder / "qasper").mkdir(parents=True, exist_ok=True)
    papers = _json_objects(_show(qasper_repo, QASPER["commit"], QASPER["file"]).decode())
    (folder / "qasper" / "qasper.json").write_text(json.dumps(papers))
    for paper in papers:
        _write_docx(paper, folder / "qasper" / f"{paper['id']}.docx")
        render_pdf(paper["title"], paper_blocks(paper), folder / "qasper" / f"{paper['id']}.pdf")
    (folder / "emanual").mkdir(parents=True, exist_ok=True)
    for name, (corpus, questions, title) in EMANUAL["manuals"].items():
        sections = json.loads(_show(emanual_repo, EMANUAL["commit"], corpus))
        render_pdf(title, manual_blocks(sections), folder / "emanual" / f"{name}.pdf")
        (folder / "emanual" / f"{name}.csv").write_bytes(_show(emanual_repo, EMANUAL["commit"], questions))


def paper_blocks(paper: dict) -> list[tuple[int, str]]:
    """A QASPER paper as (heading level, text) blocks, level 0 for a paragraph: abstract, each
    section under a heading at its depth ("Model ::: Encoder" is level 2), then the captions."""
    blocks = [(1, "Abstract"), (0, paper["abstract"])]
    full = paper["full_text"]
    for name, paragraphs in zip(full["section_name"], full["paragraphs"], strict=True):
        parts = [p.strip() for p in (name or "Section").split(":::")]
        blocks.append((min(len(parts), 3), parts[-1]))
        blocks += [(0, p) for p in paragraphs if p and p.strip()]
    blocks.append((1, "Figures and tables"))
    return blocks + [(0, caption) for caption in paper["figures_and_tables"]["caption"]]


def manual_blocks(sections: dict) -> list[tuple[int, str]]:
    """An E-Manual corpus (section id -> title, text pieces, "section_7>section_11" hierarchy) as
    (heading level, text) blocks: a heading per section at its depth, then its pieces as
    paragraphs (a manual without a hierarchy has its pieces cut mid-sentence: one paragraph)."""
    blocks = []
    for section in sections.values():
        pieces = [p for p in section["text"] if p.strip()]
        if pieces and pieces[0].strip() == section["title"].strip():
            pieces = pieces[1:]
        hierarchy = section.get("section_hierarchy")
        blocks.append((min(hierarchy.count(">") + 1, 4) if hierarchy else 2, section["title"]))
        blocks += [(0, p) for p in pieces] if hierarchy else [(0, " ".join(p.strip() for p in pieces))]
    return blocks


def render_pdf(title: str, blocks: list[tuple[int, str]], path: Path) -> None:
    """`blocks` ((heading level, text), level 0 for a paragraph) printed to an A4 PDF at `path` by
    Qt's QTextDocument and QPdfWriter (offscreen; bench only: the engine never imports Qt)."""
    import html

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QMarginsF
    from PySide6.QtGui import QGuiApplication, QPageSize, QPdfWriter, QTextDocument

    _app = QGuiApplication.instance() or QGuiApplication([])  # fonts and layout need an application
    body = "".join(f"<h{level}>{html.escape(text)}</h{level}>" if level else f"<p>{html.escape(text)}</p>"
                   for level, text in [(1, title), *blocks])
    document = QTextDocument()
    document.setHtml(body)
    writer = QPdfWriter(str(path))
    writer.setPageSize(QPageSize(QPageSize.PageSizeId.A4))
    writer.setPageMargins(QMarginsF(15, 15, 15, 15))
    writer.setTitle(title)
    document.print_(writer)


def _json_objects(text: str) -> list[dict]:
    """The JSON objects written one after another (the datasets library's `to_json(indent=2)`)."""
    decoder, at, found = json.JSONDecoder(), 0, []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return found
        value, at = decoder.raw_decode(text, at)
        found.append(value)


def _write_docx(paper: dict, path: Path) -> None:
    """The paper as Word writes it: its title, then `paper_blocks` (headings as Heading 1-3)."""
    import docx

    document = docx.Document()
    document.add_heading(paper["title"], 1)
    for level, text in paper_blocks(paper):
        if level:
            document.add_heading(text, level)
        else:
            document.add_paragraph(text)
    document.save(str(path))


def normalized(text: str) -> tuple[str, list[int]]:
    """`text` lower-cased with each run of whitespace as one space, and for each of its characters
    the offset in `text` it came from."""
    out, where, space = [], [], False
    for i, char in enumerate(text):
        if char.isspace():
            space = True
            continue
        if space and out:
            out.append(" ")
            where.append(i)
        space = False
        out.append(char.lower())
        where.append(i)
    return "".join(out), where


def locate_paragraph(texts: list[str], paragraph: str, key_chars: int = 80) -> tuple[int, int, int] | None:
    """(unit, start, end) of `paragraph` in the first of `texts` that holds its first `key_chars`
    characters (whitespace and case aside), end the offset just past it (or the unit's end), or
    None when no unit holds it."""
    key, _ = normalized(paragraph)
    if not key:
        return None
    head = key[:key_chars]
    for unit, text in enumerate(texts):
        flat, where = normalized(text)
        at = flat.find(head)
        if at >= 0:
            stop = min(at + len(key), len(flat)) - 1
            return unit, where[at], where[stop] + 1
    return None


_LATEX_DROP = re.compile(r"\$[^$]*\$|\\(?:cite[tp]?|ref|label|eqref)\{[^}]*\}|\\[A-Za-z]+|[{}\\]")
_WORD = re.compile(r"[^\W\d_]{3,}")


def words(text: str) -> list[str]:
    """The words of three or more letters in `text`, lower-cased; LaTeX math, citations, labels
    and commands dropped first (a LaTeX source paragraph and its PDF page share these words)."""
    return [w.lower() for w in _WORD.findall(_LATEX_DROP.sub(" ", text))]


def _trigrams(items: list[str]) -> set[tuple[str, ...]]:
    return {tuple(items[i:i + 3]) for i in range(len(items) - 2)}


def locate_pages(texts: list[str], source: str, min_share: float = MIN_SHARE) -> list[int]:
    """The indices of the units in `texts` that hold `FULL_SHARE` of `source`'s word trigrams, or
    where none does, those that each hold at least `PART_SHARE` (a paragraph that runs on over a
    page break is on both pages) if together they hold `min_share`; [] when the source has fewer
    than five trigrams or is nowhere."""
    wanted = _trigrams(words(source))
    if len(wanted) < 5:
        return []
    shares = [len(wanted & _trigrams(words(text))) / len(wanted) for text in texts]
    whole = [i for i, share in enumerate(shares) if share >= FULL_SHARE]
    if whole:  # pages that hold it all (a manual repeats a passage): a part elsewhere is no evidence
        return whole
    on = [i for i, share in enumerate(shares) if share >= PART_SHARE]
    return on if sum(shares[i] for i in on) >= min_share else []


def pdfqa_questions(folder: Path, texts_of) -> tuple[list[Question], int]:
    """pdfQA's questions with their evidence pages located; `texts_of(name)` gives a document's unit
    texts. Returns (questions, how many were dropped because no source could be placed)."""
    questions, dropped = [], 0
    for paper in PDFQA["papers"]:
        name = f"pdfqa/{paper}.pdf"
        texts = texts_of(name)
        for number, item in enumerate(json.loads((folder / "pdfqa" / f"{paper}.json").read_text())):
            pages = {p for source in item["source_text"] for p in locate_pages(texts, source)}
            if not pages:
                dropped += 1
                continue
            kind = "text" if set(item.get("modalities_used") or ["text"]) <= {"text"} else "table/figure"
            # the repository has no licence file: results name the question by its place, not its text
            questions.append(Question("pdfqa-research", name, item["question"], kind, f"{paper}#{number}", False,
                                      [(p, 0, len(texts[p])) for p in sorted(pages)]))
    return questions, dropped


def qasper_questions(folder: Path, texts_of, suffix: str) -> tuple[list[Question], int]:
    """QASPER's answerable questions with every annotator's evidence paragraphs located in the
    rendering `suffix` ("docx": the paragraph in its section; "pdf": the pages that hold it).
    Returns (questions, how many with evidence could not be placed)."""
    questions, dropped = [], 0
    for paper in json.loads((folder / "qasper" / "qasper.json").read_text()):
        name = f"qasper/{paper['id']}.{suffix}"
        texts = texts_of(name)
        qas = paper["qas"]
        for question, qid, answers in zip(qas["question"], qas["question_id"], qas["answers"], strict=True):
            cited = list(dict.fromkeys(e for a in answers["answer"] for e in a["evidence"] if e.strip()))
            if not cited:
                continue  # unanswerable, or no evidence given
            found = [place for e in cited for place in _placed(texts, e.removeprefix(FLOAT).strip(), suffix == "pdf")]
            if not found:
                dropped += 1
                continue
            kind = "table/figure" if any(e.startswith(FLOAT) for e in cited) else "text"
            passages = [p for e in cited if (p := locate_paragraph(texts, e.removeprefix(FLOAT).strip()))] \
                if suffix == "pdf" else []
            questions.append(Question(f"qasper-{suffix}", name, question, kind, qid[:10], True, list(dict.fromkeys(found)),
                                      passages))
    return questions, dropped


def _placed(texts: list[str], passage: str, whole_pages: bool) -> list[tuple[int, int, int]]:
    """Where `passage` is. With `whole_pages` (a PDF): the pages that hold its words
    (`locate_pages`: a passage may run on over a page break), else the page where it starts
    (`locate_paragraph`: a passage too short for trigrams), each as its whole page. Without: its
    exact place, else the units that hold its words."""
    exact = locate_paragraph(texts, passage)
    if exact and not whole_pages:
        return [exact]
    units = locate_pages(texts, passage) or ([exact[0]] if exact else [])
    return [(u, 0, len(texts[u])) for u in units]


def emanual_questions(folder: Path, texts_of) -> tuple[list[Question], int]:
    """The E-Manual questions with the pages that hold their expert answers. Returns (questions,
    how many answers could not be placed)."""
    questions, dropped = [], 0
    for manual in EMANUAL["manuals"]:
        name = f"emanual/{manual}.pdf"
        texts = texts_of(name)
        with open(folder / "emanual" / f"{manual}.csv", newline="", encoding="utf-8") as file:
            for row in csv.DictReader(file):
                found = _placed(texts, row["answer"], True)
                if not found:
                    dropped += 1
                    continue
                exact = locate_paragraph(texts, row["answer"])
                questions.append(Question(f"emanual-{manual}", name, row["question"], "manual", row["question_id"], True,
                                          found, [exact] if exact else []))
    return questions, dropped
