"""Names in an answer that its document does not contain (`DocumentWords.unsupported`), and text in
a document written as instructions to the model (`instruction_like`).

Why: a small model states invented names, numbers and quotations as calmly as real ones (the
embedded 135M model quoted an "All rights reserved" notice for a book under a Creative Commons
licence, named functions `send_post` and `self._create_response` for the `requests` library, dated
Zipf's law to an "Alfred Thomas Zipf"), and its token log-probabilities do not tell those answers
apart (see `engine.cloud.policy`: its worst errors are its most confident). Whether a name occurs in
the document at all is a check a reader can trust: a name found nowhere in it did not come from it.

Method: entity-level precision against the source, as in Nan et al., "Entity-level Factual
Consistency of Abstractive Text Summarization" (EACL 2021): the answer's named things are matched
against the source text, and a name with no match marks a likely hallucination. We match against
the *whole* document rather than the pages read, so a name the model knows from another page is not
blamed; what it catches is invention, not a wrong page. Measured on the saved answers of
`bench/doc_qa.py` (docs/BENCHMARKS.md §9): it marks the answers that name invented functions, people
and numbers, and no answer whose names all come from the document.

"Names" are what a reader would look up: quoted or back-ticked phrases, code identifiers (with `_`,
`.`, `::` or inner capitals), numbers of two or more digits, capitalised words that do not begin
a sentence, and capitals joined by hyphens ("BY-NC-SA"). Plain lower-case words are left alone:
paraphrase is not invention.
"""

from __future__ import annotations

import re

QUOTED = re.compile(r"`([^`\n]{2,80})`|\"([^\"\n]{2,80})\"|\u201c([^\u201d\n]{2,80})\u201d")
IDENTIFIER = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)+(?:\(\))?"   # a.b, a::b, a.b()
    r"|[A-Za-z0-9]*_[A-Za-z0-9_]+(?:\(\))?"                                  # snake_case, _private
    r"|[a-z]+[A-Z][A-Za-z0-9]*"                                              # camelCase
    r"|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*"                                      # CamelCase
    r"|[A-Z]{2,}[a-z][A-Za-z0-9]*")                                          # HTTPAdapter
NUMBER = re.compile(r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?(?!\w)")
# A capitalised word after a lower-case word, a number or a comma: not the first word of a sentence.
PROPER = re.compile(r"(?<=[a-z0-9,;:] )[A-Z][a-z]{2,}(?: [A-Z][a-z]+)*")
# Capitals joined by hyphens: licence codes, standards ("BY-NC-SA", "UTF-8", "ISO-8601").
CODE = re.compile(r"\b[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+\b")
WORD = re.compile(r"[a-z0-9_]+")
# Words too common to say whether a quoted phrase came from the document.
COMMON = frozenset("""the and for with from that this these those are was were been being has have had not
but its into about over under than then there here which who whom what when where why how you your our their
can could would should will may might must does did also such only other some any each all both one""".split())
MAX_LISTED = 8

# Text a document addresses to the model that reads it (a prompt injection): the phrasings of the
# OWASP LLM01 examples and of Greshake et al., "Not what you've signed up for" (AISec 2023), and the
# chat templates' own turn markers. A document *about* prompt injection matches too: the note says
# what was found and leaves the judgement to the reader.
INSTRUCTION_LIKE = re.compile(
    r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|my\s+)?"
    r"(?:(?:previous|prior|earlier|preceding|original|system)\s+(?:instructions?|prompts?|rules|messages?|directions|context)"
    r"|(?:above|foregoing)\b(?:\s+(?:instructions?|prompts?|rules|messages?|directions))?)"
    r"|\bdisregard\s+(?:the\s+|all\s+)?(?:above|instructions)"
    r"|\byou\s+are\s+now\s+(?:a|an|in|the|no\s+longer|DAN)\b"
    r"|\b(?:new|updated|real)\s+(?:system\s+)?instructions\s*:"
    r"|\bsystem\s+prompt\b"
    r"|\bdo\s+not\s+(?:tell|inform|reveal\s+(?:this\s+)?to)\s+the\s+user\b"
    r"|<\|im_start\|>|<\|im_end\|>|<\|start_header_id\|>|\[/?INST\]|<start_of_turn>", re.I)
MAX_INSTRUCTIONS_LISTED = 3
# Words every INSTRUCTION_LIKE phrase holds, found with str.find on the lower-cased text first: the
# alternation run over a whole book costs 0.23 s for 450 kB; only the places near these are searched.
_INSTRUCTION_HINTS = ("ignore", "disregard", "forget", "override", "now", "instructions", "prompt", "user",
                      "<|", "inst]", "<start_of_turn>")


def _fold(text: str) -> str:
    """Lower case with every run of white space one space, so line breaks and case never hide a match."""
    return re.sub(r"\s+", " ", text.lower())


def answer_names(answer: str) -> list[str]:
    """The names in `answer` a reader could look up in the document, in order of first mention,
    each once (see the module docstring for what counts as a name)."""
    found: list[str] = []
    for match in QUOTED.finditer(answer):
        found.append(next(group for group in match.groups() if group))
    # "i.e", "e.g": dotted, but abbreviations, not identifiers.
    found += [n for n in IDENTIFIER.findall(answer) if max(map(len, re.split(r"\.|::", n))) > 1]
    found += [n for n in NUMBER.findall(answer) if sum(c.isdigit() for c in n) >= 2]
    found += PROPER.findall(answer)
    found += CODE.findall(answer)
    return list(dict.fromkeys(name.strip() for name in found if name.strip()))


class DocumentWords:
    """A document's text, folded once, to check answers against (`unsupported`).

    text: the document as the model read it (`Document.render()`), any length; folding it costs
    about one pass over the text (tens of milliseconds for a 300-page book), so keep one per
    document rather than one per answer."""

    def __init__(self, text: str) -> None:
        self._text = _fold(text)
        self._words = frozenset(WORD.findall(self._text))
        self.instructions = instruction_like(text)  # text addressed to the model (`instruction_like`)

    def contains(self, name: str, also: str = "") -> bool:
        """`name` occurs in the document or in `also` (the question): as a whole, case and white
        space aside, or (for a phrase of several words) each of its longer words does."""
        folded = _fold(name).strip(" .,:;!?'\"")
        if folded.endswith("()"):
            folded = folded[:-2]
        if not folded:
            return True
        also = _fold(also)
        if folded in self._text or folded in also:
            return True
        words = [w for w in WORD.findall(folded) if len(w) > 2 and w not in COMMON]
        if len(words) < 2:   # a single word or identifier had to match as a whole
            return False
        return all(w in self._words or w in also for w in words)

    def unsupported(self, answer: str, question: str = "") -> list[str]:
        """The names of `answer` (see `answer_names`) found neither in the document nor in
        `question`, at most MAX_LISTED, in order of mention; [] when every name is found. Pure."""
        missing = [name for name in answer_names(answer) if not self.contains(name, question)]
        return missing[:MAX_LISTED]


def unsupported_note(names: list[str]) -> str:
    """One plain line for a reader: 'the document nowhere says "X", "Y" (the model may have made
    them up)'; "" when `names` is empty. The names are the model's words:
    whoever shows the line escapes it."""
    if not names:
        return ""
    quoted = ", ".join(f"\u201c{name}\u201d" for name in names)
    return f"the document nowhere says {quoted} (the model may have made them up)"


def instruction_like(text: str) -> list[str]:
    """The phrases of `text` written as instructions to the model that reads it ("ignore all
    previous instructions", "you are now a", "system prompt", a chat template's turn marker), each
    once (case folded), at most MAX_INSTRUCTIONS_LISTED, in order of appearance. Pure; one regular
    expression pass over `text`."""
    lowered, places = text.lower(), set()
    for hint in _INSTRUCTION_HINTS:  # where the phrases can be: the full pattern is searched only there
        at = lowered.find(hint)
        while at >= 0:
            places.add(at)
            at = lowered.find(hint, at + 1)
    found: dict[str, str] = {}
    after = 0
    for at in sorted(places):
        match = INSTRUCTION_LIKE.search(text, max(after, at - 40), at + 160)
        if match is None:
            continue
        after = match.end()
        phrase = " ".join(match.group(0).split())[:60]
        found.setdefault(phrase.lower(), phrase)
        if len(found) >= MAX_INSTRUCTIONS_LISTED:
            break
    return list(found.values())


UNIT_WORDS = ("page", "slide", "sheet")
"""A segment label's first word that names a unit the reader sees in the file too."""


def checked_unit(places) -> str:
    """What a reader checks an answer against, named as its document has it, from its sources and
    passages `places` (`engine.answer.Source` / `engine.attended.AttendedSpan`: a `label` and a
    `path`): "the page" (a PDF's, an image's), "the slide" or "the sheet" (a presentation's, a
    workbook's), "the file" (a folder's), "the passage" (a text, a word-processor document, an
    e-book: no pages a reader sees; a .docx is one segment numbered page 1, so the label decides,
    not the page number), "the document" when there is none (no source recorded)."""
    places = list(places)
    for unit in UNIT_WORDS:
        if any(p.label.startswith(f"{unit} ") for p in places):
            return f"the {unit}"
    if any(p.path for p in places):
        return "the file"
    return "the passage" if places else "the document"


def instructions_note(phrases: list[str], unit: str = "the page") -> str:
    """One plain line for a reader when the document holds text addressed to the model: 'the
    document contains text written as instructions to the model ("ignore all previous
    instructions"): the answer may follow it instead of the document; check it against the
    page'; "" when `phrases` is empty. `unit`: what the reader checks it against, as the document
    has it ("the page" of a PDF, "the passage" of a text). The phrases are the document's: whoever
    shows it escapes it."""
    if not phrases:
        return ""
    quoted = ", ".join(f"\u201c{phrase}\u201d" for phrase in phrases)
    return (f"the document contains text written as instructions to the model ({quoted}): the answer may follow "
            f"it instead of the document; check it against {unit}")
