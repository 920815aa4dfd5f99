"""Words hyphenated at line ends joined again: "docu-" / "ment" becomes "document" (B28).

A PDF keeps the line breaks its typesetter chose, and every extractor gives them back:
"docu-\\nment" is two words to the full-text index and to the model's tokenizer, so a question
about a "document" does not find the page. Only PDF pages are joined (`engine.documents.pdf`);
a text file's line-end hyphen is the author's.

Not every hyphen at a line end breaks a word: "well-" / "known" is a compound that happened to
fall there. Without a dictionary per language the document itself is the evidence: a hyphenated
pair that also occurs on one line elsewhere in the document ("well-known") keeps its hyphen,
unless the joined word occurs too ("e-mail" and "email"). A second part that starts with a
capital ("Mercedes-" / "Benz", "anti-" / "EU"), a first part that already holds a hyphen ("state-of-" /
"the-art"), and parts in different scripts keep their hyphen as well; a digit after the hyphen
("COVID-" / "19") is no word and is left as it is. A soft
hyphen (U+00AD) is always a break. Hyphens inside a line are never touched.

The line structure stays: the second part moves up to the first, and the rest of its line
starts a line as before ("the docu-\\nment and" becomes "the document\\nand"), so a page keeps its
lines. Highlights are found on the page by its characters without white space and hyphens
(`app.source_pane.locate`), so the joined words still land on PDFium's boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

from engine.documents.text import scripts_of

HYPHENS = "-\u2010\u00ad"
"""Characters that can end a line inside a word: hyphen-minus, HYPHEN, SOFT HYPHEN."""

_PART = r"[\p{L}\p{M}]+(?:[-\u2010][\p{L}\p{M}]+)*"  # a word, with the hyphens of a compound
_BREAK = regex.compile(rf"(?P<head>{_PART})(?P<hyphen>[{HYPHENS}])[ \t]*\n[ \t]*(?P<tail>{_PART})(?P<rest>\S*)[ \t]*")
_WORD = regex.compile(r"[\p{L}\p{M}]+")
_COMPOUND = regex.compile(r"[\p{L}\p{M}]+(?:[-\u2010][\p{L}\p{M}]+)+")
_MARK = regex.compile(r"\p{M}")


def join_hyphenated_lines(pages: Sequence[str]) -> list[str]:
    """The texts of one document's pages (normalised, `normalize_text`) with every word that is
    hyphenated at a line end joined, each page on its own (a word split across two pages stays
    split: each page is cited alone). The result is normalised too; pages without such a break
    come back unchanged."""
    if not any(_BREAK.search(page) for page in pages):
        return list(pages)
    words: set[str] = set()
    compounds: set[str] = set()
    for page in pages:
        words.update(word.lower() for word in _WORD.findall(page))
        compounds.update(compound.lower().replace("\u2010", "-") for compound in _COMPOUND.findall(page))
    return [_join_page(page, words, compounds) for page in pages]


def _join_page(text: str, words: set[str], compounds: set[str]) -> str:
    def join(match: regex.Match[str]) -> str:
        head, hyphen, tail = match["head"], match["hyphen"], match["tail"]
        keep = hyphen != "\u00ad" and _keeps_hyphen(head, tail, words, compounds)
        joined = head + (hyphen if keep else "") + tail + match["rest"]
        more = match.end() < len(text) and text[match.end()] != "\n"
        return joined + ("\n" if more else "")

    return _BREAK.sub(join, text)


def _keeps_hyphen(head: str, tail: str, words: set[str], compounds: set[str]) -> bool:
    """Whether `head` + "-" + `tail` is a compound rather than one word broken at a line end."""
    last, first = _MARK.sub("", head)[-1:], tail[0]
    if "-" in head or "\u2010" in head:
        return True
    if first.isupper() or first.istitle() or not (scripts_of(last) & scripts_of(first)):
        return True
    if (head + tail).lower() in words:
        return False
    return f"{head}-{tail}".lower() in compounds
