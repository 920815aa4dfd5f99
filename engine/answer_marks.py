"""The marks under an answer, each on the sentence it doubts (`answer_marks`).

Why: an answer-level warning ("check this answer") leaves the reader to find what is wrong in a
paragraph. A mark here names the answer's sentence and the figure or name it doubts, and says
whether that sentence is the *direct answer* (the first sentence, the list it introduces, the
sentence that states the asked figure, a closing "So, …") or a *side remark*:

- **number** (direct answer only): every figure the direct answer states is missing from the
  quoted passages while they hold numbers (`engine.evidence_quotes.number_caution`'s rule, applied
  to the direct answer instead of the whole text: a side remark may cite a figure from another page
  of the document, which is paraphrase, not a wrong cell);
- **name**: a name or identifier found nowhere in the document (`engine.grounding`, given as the
  answer's `unsupported` names), on the sentence that states it: a mark in the direct answer, a
  note on a side remark (the direct answer may still be right: "Zipf's law … named after Alfred
  Thomas Zippers");
- **yes/no**: the direct yes/no contradicts a quoted passage (`engine.evidence.yes_no`);
- **period** (a number mark): the direct answer's figure is held, but as one of a row of four
  amounts (a quarterly table) while the question asks about a year (`engine.evidence.period`).

`AnswerMark.direct` tells them apart; bench/answer_marks.py counts both (docs/BENCHMARKS.md §9a).
Torch-free and pure: strings and `QuotedPassage`s in, `AnswerMark`s out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.evidence.yes_no import contradiction
from engine.evidence.period import quarter_cell
from engine.evidence_quotes import QuotedPassage, number_caution, quote_text, stated_figures
from engine.grounding import IDENTIFIER

_WEB_ENDINGS = frozenset(["com", "org", "net", "edu", "gov", "io", "html", "htm", "pdf", "txt", "py"])
CLAIM_CHARACTERS = 120
"""A doubted sentence is quoted in a mark up to this many characters."""
_LINE = re.compile(r"\n+")
# A sentence ends at . ! ? before white space and a capital, a quote or a bracket; a piece that ends
# in a list's item number ("1. Delta"), an initial ("U.S. sales") or an abbreviation is joined on.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"\u201d')\]]))\s+(?=[A-Z\"\u201c(\[`])")
_NOT_AN_END = re.compile(r"(?:^|\s)(?:\d{1,2}|[A-Za-z]|(?:[A-Za-z]\.)+[A-Za-z]|Inc|Corp|Co|Ltd|No|Nos|Mr|Mrs|Ms|Dr|St|vs|"
                         r"etc|approx|Fig|e\.g|i\.e)\.$")
_CONCLUSION = re.compile(r"\s*(?:so|therefore|thus|hence|in conclusion|in summary|in short)\b", re.IGNORECASE)
# A question that asks for a figure: how much or how many, a rounding or a unit asked for, or "what
# is/was the" amount, ratio, rate, margin, percentage, total ("What drove the reduction in SG&A as
# a percent of net sales" asks for a cause, not a figure).
_ASKS_FIGURE = re.compile(r"\bhow (?:much|many)\b|\bround (?:your |the )?answer\b|\banswer in (?:usd|units|percent)",
                          re.IGNORECASE)
_ASKS_QUANTITY = re.compile(r"\bwhat (?:is|was|were|are)\b[^?]*\b(?:amount|ratio|rate|margin|percent(?:age)?|total|"
                            r"number of|turnover|revenues?|liabilities|assets)\b", re.IGNORECASE)


@dataclass(frozen=True)
class AnswerSentence:
    """One sentence (or list line) of an answer: its `text`, white space collapsed, and whether it
    belongs to the `direct` answer."""

    text: str
    direct: bool


@dataclass(frozen=True)
class AnswerMark:
    """A doubt about one sentence of an answer. kind: "number" | "name" | "yes/no"; claim: the
    sentence (white space collapsed); doubted: the figures or names it doubts (for yes/no, the
    claim); direct: the sentence is (part of) the direct answer; note: one line for a reader,
    naming the sentence and what is doubted (the model's words inside: whoever shows it escapes it)."""

    kind: str
    claim: str
    doubted: tuple[str, ...]
    direct: bool
    note: str


def _sentences(answer: str) -> list[str]:
    found = []
    for line in _LINE.split(answer):
        pieces: list[str] = []
        for part in _SENTENCE_END.split(line.strip()):
            if pieces and _NOT_AN_END.search(pieces[-1]):
                pieces[-1] += " " + part
            elif part.strip():
                pieces.append(part)
        found += [" ".join(piece.split()) for piece in pieces]
    return found


def answer_sentences(answer: str, question: str = "") -> list[AnswerSentence]:
    """The sentences of `answer` in order, each marked `direct` when it is the first one, a line of
    the list the first one introduces (it ends with ':'), the first that states a figure when
    `question` asks for one, or a closing conclusion ("So, …", "Therefore …")."""
    from engine.evidence_quotes import stated_figures

    texts = _sentences(answer)
    direct = [False] * len(texts)
    if not texts:
        return []
    direct[0] = True
    # "The customers are:" and its list; or a short lead-in after the first sentence ("These include:").
    lead_in = 0 if texts[0].endswith(":") else 1 if len(texts) > 1 and texts[1].endswith(":") and len(texts[1].split()) <= 6 else None
    if lead_in is not None:
        at = lead_in
        direct[at] = True
        while at + 1 < len(texts) and re.match(r"(?:[-*\u2022]|\d{1,2}[.)])\s", texts[at + 1]):
            at += 1
            direct[at] = True
    if _ASKS_FIGURE.search(question) or _ASKS_QUANTITY.search(question):
        stating = next((i for i, t in enumerate(texts) if stated_figures(t)), None)
        if stating is not None:
            direct[stating] = True
    for i, text in enumerate(texts):
        if i > 0 and _CONCLUSION.match(text):
            direct[i] = True
    return [AnswerSentence(text, flag) for text, flag in zip(texts, direct, strict=True)]


def _said_in(claim: str) -> str:
    return f"said in \u201c{quote_text(claim, CLAIM_CHARACTERS)}\u201d"


def _number_mark(sentences: list[AnswerSentence], question: str, quoted: Sequence[QuotedPassage]) -> AnswerMark | None:
    direct = [s for s in sentences if s.direct]
    caution = number_caution("\n".join(s.text for s in direct), question, quoted)
    if caution is None:
        return None
    figure = caution.removeprefix("check the number: ").split(" is not in", 1)[0]
    claim = next((s.text for s in direct if figure in s.text), direct[0].text)
    return AnswerMark("number", claim, (figure,), True, f"{caution} — {_said_in(claim)}")


def _period_mark(sentences: list[AnswerSentence], question: str, quoted: Sequence[QuotedPassage]) -> AnswerMark | None:
    """A figure the quoted passages hold, but as one quarter of a row of four, for a question about
    the year (`engine.evidence.period`)."""
    direct = [s for s in sentences if s.direct]
    figures = stated_figures("\n".join(s.text for s in direct))
    cell = quarter_cell(question, figures, [(p.label, p.text) for p in quoted])
    if cell is None:
        return None
    claim = next((s.text for s in direct if cell.figure in s.text), direct[0].text)
    return AnswerMark("number", claim, (cell.figure,), True, f"{cell.note()} — {_said_in(claim)}")


def _code_names(text: str) -> list[str]:
    """The code identifiers of `text` (`engine.grounding.IDENTIFIER`: dotted, snake_case, camelCase;
    back-ticked or not), each once; not a capitalised brand ("PepsiCo"), an abbreviation ("e.g")
    or a web address ("gutenberg.org")."""
    found = []
    for name in IDENTIFIER.findall(text):
        name = name.removesuffix("()")
        parts = re.split(r"\.|::", name)
        if ("_" in name or len(parts) > 1 or name[0].islower()) and min(map(len, parts)) > 1 \
                and parts[-1].lower() not in _WEB_ENDINGS:
            found.append(name)
    return list(dict.fromkeys(found))


def _identifier_mark(sentences: list[AnswerSentence], question: str, quoted: Sequence[QuotedPassage]) -> AnswerMark | None:
    """A mark when the direct answer names code identifiers (not the question's) and none of them
    is in the quoted passages: the answer named something other than what it read (the Ackermann
    exercise answered `is_power`, a function of another exercise)."""
    if not quoted:
        return None
    held = " ".join(p.text for p in quoted)
    for sentence in (s for s in sentences if s.direct):
        names = [n for n in _code_names(sentence.text) if n not in question]
        if names and not any(n in held for n in names):
            where = quoted[0]
            return AnswerMark("name", sentence.text, tuple(names), True,
                              f"check the name: {_listed(names)} is not in what the answer read most ({where.label}: "
                              f"\u201c{quote_text(where.text, 80)}\u201d) — {_said_in(sentence.text)}")
    return None


def _listed(names: Sequence[str]) -> str:
    return ", ".join(f"\u201c{n}\u201d" for n in names)


def _name_marks(sentences: list[AnswerSentence], unsupported: Sequence[str], checked: str = "") -> list[AnswerMark]:
    """One mark for the direct answer's names found nowhere in the document, then one note per side
    remark that states such names. checked: the sentence whose figures the number mark already
    doubts (its unsupported numbers are not named twice)."""
    by_sentence: dict[int, list[str]] = {}
    nowhere: list[str] = []  # names not found in a sentence as written (the answer's text changed since)
    for name in unsupported:
        folded = " ".join(name.split()).lower()
        at = next((i for i, s in enumerate(sentences) if folded in s.text.lower()), None)
        if at is None:
            nowhere.append(name)
        elif not (sentences[at].text == checked and re.fullmatch(r"[\d.,]+", name)):
            by_sentence.setdefault(at, []).append(name)
    direct = [at for at in sorted(by_sentence) if sentences[at].direct]
    marks = []
    if direct:
        names = [n for at in direct for n in by_sentence[at]]
        claim = sentences[direct[0]].text
        more = f" and {len(direct) - 1} more line{'s' if len(direct) > 2 else ''}" if len(direct) > 1 else ""
        verb = "is" if len(names) == 1 else "are"
        marks.append(AnswerMark("name", claim, tuple(names), True,
                                f"check the name{'s' if len(names) > 1 else ''}: {_listed(names)} {verb} nowhere in the "
                                f"document — {_said_in(claim)}{more}"))
    for at in sorted(by_sentence):
        if not sentences[at].direct:
            sentence, names = sentences[at], by_sentence[at]
            marks.append(AnswerMark("name", sentence.text, tuple(names), False,
                                    f"a side remark names what the document nowhere says: {_listed(names)} — "
                                    f"{_said_in(sentence.text)}"))
    if nowhere:
        marks.append(AnswerMark("name", "", tuple(nowhere), False,
                                f"the answer names what the document nowhere says: {_listed(nowhere)}"))
    return marks


def answer_marks(answer: str, question: str, quoted: Sequence[QuotedPassage],
                 unsupported: Sequence[str] = ()) -> list[AnswerMark]:
    """The marks on `answer` to `question` (see the module docstring): the yes/no contradiction,
    the number mark, then the names, direct-answer marks first. quoted: the passages quoted under
    the answer (`engine.evidence_quotes.quoted_passages`, strongest first; their text is what the
    checks compare); unsupported: the answer's names found nowhere in the document
    (`Answer.unsupported`). [] for an empty answer or when nothing is doubted."""
    sentences = answer_sentences(answer, question)
    if not sentences:
        return []
    marks: list[AnswerMark] = []
    opposite = contradiction(question, answer, [(p.label, p.text) for p in quoted])
    if opposite is not None:
        marks.append(AnswerMark("yes/no", opposite.claim, (opposite.claim,), True,
                                f"{opposite.note()} — {_said_in(opposite.claim)}"))
    number = _number_mark(sentences, question, quoted) or _period_mark(sentences, question, quoted)
    if number is not None:
        marks.append(number)
    identifier = _identifier_mark(sentences, question, quoted)
    if identifier is not None:
        marks.append(identifier)
    return marks + _name_marks(sentences, unsupported, number.claim if number is not None else "")


def direct_marks(marks: Sequence[AnswerMark]) -> list[AnswerMark]:
    """The marks of `marks` on the direct answer (what the answer is marked by; the others are
    notes on side remarks)."""
    return [m for m in marks if m.direct]


__all__ = ["AnswerMark", "AnswerSentence", "answer_marks", "answer_sentences", "direct_marks"]
