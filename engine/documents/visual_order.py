"""Right-to-left text that an extractor gives in visual order, put back into logical order.

A PDF draws Hebrew and Arabic as a viewer shows them: glyphs left to right, the word's last
letter first. PDFium and pypdf put such a line back into reading (logical) order with the
Unicode bidirectional algorithm; pdfminer.six, the third opinion for fonts without a Unicode map
(`engine.documents.pdf_worker`), gives the characters in the order they are drawn, so every
right-to-left word came out backwards ("ךירצ" for "צריך", "مداخلل" for "للخادم"; issue 45).

Which order a text is in shows in the letters themselves, whatever drew them:
- Hebrew has final forms (ך ם ן ף ץ) that end a word, and never ends one with their ordinary
  forms (כ מ נ פ צ); backwards, words start with a final form and end with an ordinary one.
- Arabic's teh marbuta and alef maksura (ة ى) end words; the article "ال" starts a fifth of them.
  Backwards, "ة" starts words and "لا" ends them. (Some words also end in "لا", "مثلا": the
  article outnumbers them, so only the balance counts.)
- Presentation forms (U+FB50-U+FEFF): a final form starts a backwards word, an initial form ends it.
`logical_order` counts both kinds of evidence over a page and turns the lines around only when
the backwards evidence wins clearly; text in logical order (P10, B19) is left as it is.

Turning a visual line around is the bidirectional algorithm run backwards, for the cases a page
has: a line whose rightmost letter is right-to-left is a right-to-left paragraph (the whole line
is reversed, then each left-to-right run - Latin words, numbers such as "14:30",
and the spaces between two Latin words - is put back the right way round); in a left-to-right
line only the right-to-left runs are reversed (with the numbers inside them kept as they are).
"""

from __future__ import annotations

import re
import unicodedata

MIN_EVIDENCE = 2
"""A page is turned around only with at least this many backwards words, and more backwards words
than forwards ones."""

_HEBREW_FINAL = frozenset("ךםןףץ")
_HEBREW_ORDINARY = frozenset("כמנפצ")
_ARABIC_WORD_END = frozenset("ةى")
_RTL_SCRIPT = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]")  # Hebrew, Arabic, Syriac, Thaana, NKo…


def logical_order(text: str) -> str:
    """`text` (a page, lines separated by "\\n" or "\\r\\n") with its right-to-left lines in
    logical order when its words show they are in visual order; else `text` unchanged."""
    if not _RTL_SCRIPT.search(text):
        return text  # almost every page: one regular-expression scan
    forwards, backwards = order_evidence(text)
    if backwards < MIN_EVIDENCE or backwards <= forwards:
        return text
    return "\n".join(_line_to_logical(line) for line in text.replace("\r\n", "\n").split("\n"))


def order_evidence(text: str) -> tuple[int, int]:
    """(words in logical order, words in visual order) by the letters that start and end
    right-to-left words (see the module's docstring)."""
    forwards = backwards = 0
    for word in _rtl_words(text):
        first, last = word[0], word[-1]
        if last in _HEBREW_FINAL or last in _ARABIC_WORD_END or _form(last) == "FINAL" or _form(first) == "INITIAL":
            forwards += 1
        if first in _HEBREW_FINAL or first in _ARABIC_WORD_END or _form(first) == "FINAL" or _form(last) == "INITIAL":
            backwards += 1
        if last in _HEBREW_ORDINARY:
            backwards += 1
        if len(word) >= 4 and word.startswith("ال"):
            forwards += 1
        if len(word) >= 4 and word.endswith("لا"):
            backwards += 1
    return forwards, backwards


def _rtl_words(text: str) -> list[str]:
    """Runs of two or more right-to-left letters, marks (harakat, niqqud) removed."""
    words: list[str] = []
    current: list[str] = []
    for char in text + " ":
        if unicodedata.category(char) == "Mn":
            continue
        if _is_rtl(char) and char.isalpha():
            current.append(char)
            continue
        if len(current) >= 2:
            words.append("".join(current))
        current = []
    return words


def _form(char: str) -> str | None:
    """"INITIAL" or "FINAL" for an Arabic presentation form of that kind, else None."""
    if "\ufb50" <= char <= "\ufeff":
        name = unicodedata.name(char, "")
        for form in ("INITIAL", "FINAL"):
            if name.endswith(f"{form} FORM"):
                return form
    return None


def _is_rtl(char: str) -> bool:
    return unicodedata.bidirectional(char) in ("R", "AL")


def _kind(char: str) -> str:
    """"R" right-to-left letter, "L" left-to-right letter, "D" digit, "S" a separator inside a
    number (":", ",", ".", "-", "/", "%"), "N" anything else (spaces, punctuation)."""
    kind = unicodedata.bidirectional(char)
    if kind in ("R", "AL"):
        return "R"
    if kind == "L":
        return "L"
    if kind in ("EN", "AN"):
        return "D"
    if kind in ("CS", "ES", "ET"):
        return "S"
    return "N"


def _line_to_logical(line: str) -> str:
    kinds = [_kind(char) for char in line]
    if "R" not in kinds:
        return line
    # A paragraph's first letter in reading order is its direction (UAX #9 P2); a visual line
    # shows a right-to-left paragraph's first letter rightmost.
    if next(kind for kind in reversed(kinds) if kind in ("R", "L")) == "R":
        return _reverse_span(line, kinds, keep="LDS")
    pieces: list[str] = []
    index = 0
    while index < len(line):
        if kinds[index] != "R":
            pieces.append(line[index])
            index += 1
            continue
        end = index
        for probe in range(index, len(line)):  # the span ends at its last R before an L letter
            if kinds[probe] == "L":
                break
            if kinds[probe] == "R":
                end = probe
        pieces.append(_reverse_span(line[index:end + 1], kinds[index:end + 1], keep="DS"))
        index = end + 1
    return "".join(pieces)


def _reverse_span(text: str, kinds: list[str], keep: str) -> str:
    """`text` reversed as a right-to-left paragraph: runs that stay left to right (letters and
    numbers of a kind in `keep`, with separators and, between two Latin letters, spaces inside
    them) keep their own order."""
    stays = [kind in keep and kind != "S" for kind in kinds]
    for index, kind in enumerate(kinds):
        before = kinds[index - 1] if index else None
        after = kinds[index + 1] if index + 1 < len(kinds) else None
        if kind == "S" and unicodedata.bidirectional(text[index]) == "ET":
            stays[index] = "D" in (before, after)  # "50%", "$12"
        elif kind == "S":
            stays[index] = before in keep and after in keep and "S" not in (before, after)  # "14:30", "DB-01"
        elif kind == "N" and "L" in keep:
            before = next((kinds[i] for i in range(index - 1, -1, -1) if kinds[i] != "N"), None)
            after = next((kinds[i] for i in range(index + 1, len(kinds)) if kinds[i] != "N"), None)
            stays[index] = before == after == "L"  # the space inside "Backup server"
    runs: list[tuple[bool, str]] = []
    for char, stay in zip(text, stays):
        if runs and runs[-1][0] == stay and stay:
            runs[-1] = (True, runs[-1][1] + char)
        else:
            runs.append((stay, char))
    return "".join(piece for _, piece in reversed(runs))
