"""Text normalisation and text-quality measures, shared by every document loader.

`normalize_text` is applied to every page and file before it is stored or tokenized, so that the
same document always gives the same string (and therefore the same token ids and prefix-cache keys).
`measure` scores extracted text; the PDF loader uses it to choose an extractor per page and to flag
unreadable pages, and `bench/pdf_text_quality.py` uses it to compare extractors over the corpus.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

LONG_RUN_LETTERS = 20
"""A run of this many letters without a space is counted as lost word boundaries. Measured on
P16 (Think Python): pypdf glues justified lines into runs like "withJavawasstriking"; real English
words of 20+ letters are rare enough that each run is worth a look (pypdf issue 7 in this repo)."""

# Alphabetic Presentation Forms, Latin ligatures U+FB00..U+FB06 (P11: "ﬁlled"). Mapped one by one
# instead of NFKC, because NFKC also rewrites superscripts (km² → km2), fractions, ℝ → R,
# full-width forms and Arabic presentation forms: meaning the model should see as printed.
_LIGATURES = str.maketrans({
    "\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi",
    "\ufb04": "ffl", "\ufb05": "st", "\ufb06": "st",
})
# C0 and C1 controls except \t and \n (\r is turned into \n first). P15 has 527 NULs in pypdf's
# text and bytes 0x01..0x1f in PDFium's; NUL also truncates strings in some SQLite/C paths.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Noncharacters and lone surrogates (from malformed UTF-16 in ToUnicode maps) cannot be encoded
# as UTF-8 and must never reach SQLite or the tokenizer.
_INVALID = re.compile("[\ufdd0-\ufdef\ufffe\uffff\ud800-\udfff]")
# pypdf prints an unmapped glyph as its name: "/g1/g2/g3" (synthetic test in test_documents_pdf);
# three or more digit-numbered names in a row are not prose or a file path.
_GLYPH_NAMES = re.compile(r"(?:/[A-Za-z]{1,8}\d+){3,}")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_MANY_BLANK_LINES = re.compile(r"\n{3,}")


def _build_mark_class() -> str:
    """Character-class body for combining marks (Mn/Mc/Me) in the BMP, as escaped ranges."""
    ranges: list[tuple[int, int]] = []
    for code in range(0x300, 0x10000):
        if unicodedata.category(chr(code))[0] == "M":
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return "".join(f"\\u{a:04x}-\\u{b:04x}" if a != b else f"\\u{a:04x}" for a, b in ranges)


# A "word" is a run of letters with their combining marks: Arabic harakat and Latin accents in NFD
# must not split a word (P10 "حَبيبي").
_MARK_CLASS = _build_mark_class()
_MARK = re.compile(f"[{_MARK_CLASS}]")
_WORD = re.compile(f"(?:[^\\W\\d_]|[{_MARK_CLASS}])+")
_LATIN_ONLY = frozenset({"LATIN"})
_CJK_SCRIPTS = frozenset({"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "IDEOGRAPHIC", "HALFWIDTH"})
_LATIN_FAMILY = frozenset({"LATIN", "GREEK", "MATHEMATICAL", "DOUBLE-STRUCK", "SCRIPT",
                           "BLACK-LETTER", "FULLWIDTH", "MICRO"})
_RTL_SCRIPTS = frozenset({"ARABIC", "HEBREW", "SYRIAC", "THAANA", "NKO"})
_LATIN_VOWELS = frozenset("aeiouyAEIOUY")


def normalize_text(text: str) -> str:
    """Return `text` in the one form Halaman stores and tokenizes.

    - CRLF and lone CR → LF; NUL and other C0/C1 controls removed (\\n and \\t kept): CASES.md P15.
    - Noncharacters (U+FFFE, U+FFFF, U+FDD0..U+FDEF) and lone surrogates removed.
    - Latin ligatures U+FB00..U+FB06 spelled out ("ﬁ" → "fi", CASES.md P11), then NFC, so that
      search and prefix-cache keys do not depend on how a PDF encoded a letter. Not NFKC: it would
      also rewrite superscripts, fractions and math letters.
    - Trailing spaces on a line removed, runs of blank lines collapsed to one, ends trimmed.
    Idempotent: normalize_text(normalize_text(s)) == normalize_text(s).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _INVALID.sub("", text)
    text = unicodedata.normalize("NFC", text.translate(_LIGATURES))
    text = _TRAILING_SPACE.sub("\n", text)
    text = _MANY_BLANK_LINES.sub("\n\n", text)
    return text.strip()


@functools.lru_cache(maxsize=4096)
def script_of(char: str) -> str | None:
    """Script family of a letter, from its Unicode name ("LATIN", "ARABIC", "CJK", ...).

    Families, not scripts: Han, kana and Hangul are one ("CJK"), because Japanese and Korean mix
    them within words; Greek and mathematical letters count as "LATIN", because science writing
    mixes them within tokens (P15: "κNor", "ϕi"; P16: "πr"). Modifier letters (P15's "Pˆ") belong
    to no family: None.
    """
    try:
        first = unicodedata.name(char).split(" ", 1)[0]
    except ValueError:
        return "UNKNOWN"
    if first in _CJK_SCRIPTS:
        return "CJK"
    if first in _LATIN_FAMILY:
        return "LATIN"
    return None if first == "MODIFIER" else first


def long_letter_runs(text: str, min_letters: int = LONG_RUN_LETTERS) -> list[str]:
    """Every run of at least `min_letters` letters with no space or punctuation inside."""
    return [word for word in _WORD.findall(text) if _letter_count(word) >= min_letters]


def _letter_count(word: str) -> int:
    return len(word) if word.isascii() else len(word) - len(_MARK.findall(word))


def _scripts(word: str) -> frozenset[str]:
    if word.isascii():
        return _LATIN_ONLY
    return frozenset(filter(None, map(script_of, _MARK.sub("", word)))) or _LATIN_ONLY


def _is_wordlike(word: str, scripts: frozenset[str], letters: int) -> bool:
    """Heuristic "would a dictionary know this?": one script, plausible case, a vowel if Latin.

    Catches what broken fonts produce (P08's fake-bold "DDaattaa", P10's "ϲΒϴΒ", consonant soup
    from glyph-id text) without shipping a dictionary per language.
    """
    if len(scripts) != 1 or letters >= LONG_RUN_LETTERS:
        return False
    cased = word.lower() != word.upper()
    if cased and not (word.islower() or word.isupper() or (word[0].isupper() and word[1:].islower())):
        return False
    if scripts == _LATIN_ONLY and letters > 1:
        base = word if word.isascii() else unicodedata.normalize("NFD", word)
        return any(ch in _LATIN_VOWELS for ch in base)
    return True


@dataclass(frozen=True)
class TextQuality:
    """What can be measured about extracted text without knowing what the page shows.

    All counts are characters unless named otherwise. `score` combines them into 0..1 (1 = clean).
    """

    chars: int                 # non-whitespace characters
    letters: int
    words: int                 # runs of letters (with their combining marks)
    long_runs: int             # words of >= LONG_RUN_LETTERS letters: lost word boundaries
    long_run_letters: int      # letters inside those words
    nul: int                   # U+0000 (pypdf on P15)
    control: int               # other C0/C1 controls except \t \n \r
    replacement: int           # U+FFFD: a decoder gave up
    private_use: int           # U+E000..U+F8FF and planes 15-16: font glyph ids without Unicode
    mixed_script_letters: int  # letters in words that mix script families, e.g. Latin + Cyrillic
    rtl_letters: int           # Arabic/Hebrew letters: PDFium's ordering of these is unreliable
    glyph_names: int           # characters of "/g1/g2/g3" runs: glyphs without Unicode (pypdf)
    wordlike_words: int        # words that pass the dictionary-like heuristic

    @property
    def wordlike_share(self) -> float:
        """Share of words under LONG_RUN_LETTERS that look like dictionary words (1.0 if none)."""
        short_words = self.words - self.long_runs
        return self.wordlike_words / short_words if short_words else 1.0

    @property
    def bad_chars(self) -> int:
        """Characters that carry no reliable meaning for the model."""
        return self.garbage + self.long_run_letters

    @property
    def garbage(self) -> int:
        """Characters that are certainly not text: everything in `bad_chars` but long runs."""
        return (self.nul + self.control + self.replacement + self.private_use
                + self.mixed_script_letters + self.glyph_names)

    @property
    def score(self) -> float:
        """0..1: share of clean characters times the share of dictionary-like words; 0 if empty."""
        if self.chars == 0:
            return 0.0
        return max(0.0, 1.0 - self.bad_chars / self.chars) * self.wordlike_share


def measure(text: str) -> TextQuality:
    """Measure raw extracted text (before `normalize_text`, so that NULs and controls still count)."""
    counts = Counter(text)
    nul = counts.get("\x00", 0)
    control = sum(n for ch, n in counts.items() if _CONTROL.match(ch)) - nul
    private_use = sum(n for ch, n in counts.items()
                      if "\ue000" <= ch <= "\uf8ff" or ord(ch) >= 0xF0000)
    whitespace = sum(n for ch, n in counts.items() if ch.isspace())
    glyph_names = sum(len(match) for match in _GLYPH_NAMES.findall(text))
    words = _WORD.findall(_GLYPH_NAMES.sub(" ", text))
    long_runs = long_run_letters = mixed = rtl = wordlike = letters = 0
    for word in words:
        scripts = _scripts(word)
        n_letters = _letter_count(word)
        letters += n_letters
        if n_letters >= LONG_RUN_LETTERS:
            long_runs += 1
            long_run_letters += n_letters
        if len(scripts) > 1:
            mixed += n_letters
        if scripts & _RTL_SCRIPTS:
            rtl += n_letters
        if _is_wordlike(word, scripts, n_letters):
            wordlike += 1
    return TextQuality(
        chars=len(text) - whitespace, letters=letters, words=len(words), long_runs=long_runs,
        long_run_letters=long_run_letters, nul=nul, control=control,
        replacement=counts.get("\ufffd", 0), private_use=private_use, mixed_script_letters=mixed,
        rtl_letters=rtl, glyph_names=glyph_names, wordlike_words=wordlike,
    )


def same_content(a: str, b: str) -> bool:
    """True when two extractions hold the same non-whitespace characters (in any order).

    Then they differ only in where words break, and the one with more breaks is preferred:
    extractors lose spaces far more often than they invent them (P14, P16).
    """
    return Counter(ch for ch in a if not ch.isspace()) == Counter(ch for ch in b if not ch.isspace())


UNRELIABLE_GARBAGE_SHARE = 0.25
"""A page where this share of characters is NUL/control/U+FFFD/private-use/mixed-script or
glyph names is noise."""

UNRELIABLE_WORDLIKE_SHARE = 0.4
"""...or where fewer than this share of its words look like words (with at least 8 words).
Measured on the chosen text of every corpus page: word-like share is at least 0.77 (P15 page 46,
formulas) and garbage at most 5.4% (P15 page 15), so both limits leave a wide margin."""


def is_unreliable(quality: TextQuality) -> bool:
    """Whether text is too noisy to give the model: a font without a Unicode map, mojibake.

    Word-boundary loss alone never makes text unreliable (German compounds are long words).
    """
    if quality.chars == 0:
        return False
    return (quality.garbage / quality.chars >= UNRELIABLE_GARBAGE_SHARE
            or (quality.words >= 8 and quality.wordlike_share < UNRELIABLE_WORDLIKE_SHARE))
