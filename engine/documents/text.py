"""Text normalisation and text-quality measures, shared by every document loader.

`normalize_text` is applied to every page and file before it is stored or tokenized, so that the
same document always gives the same string (and therefore the same token ids and prefix-cache keys).
`measure` scores extracted text; the PDF loader uses it to choose an extractor per page and to flag
unreadable pages, and `bench/pdf_text_quality.py` uses it to compare extractors over the corpus.
Case ids (P08, P10, P15, …) name the test-corpus PDFs of docs/CORPUS.md.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

import regex
from fontTools.unicodedata import script_extension

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
# pdfminer.six prints one as "(cid:12)"; one of those is enough.
_GLYPH_NAMES = re.compile(r"(?:/[A-Za-z]{1,8}\d+){3,}|\(cid:\d+\)")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_MANY_BLANK_LINES = re.compile(r"\n{3,}")
# A "word" is a run of letters with their combining marks (Unicode properties, `regex`): Arabic
# harakat, Devanagari vowel signs and Latin accents in NFD must not split a word (P10 "حَبيبي").
_WORD = regex.compile(r"[\p{L}\p{M}]+")
_MARK = regex.compile(r"\p{M}")
# Invisible format characters (soft hyphen, zero-width space, word joiner, BOM, bidi marks)
# between two letters: PDFs and web copies leave them inside words, where they split tokens.
# ZWNJ/ZWJ are spelling in Persian and Indic scripts and stay.
_FORMAT_IN_WORD = regex.compile(r"(?<=[\p{L}\p{M}])[\p{Cf}--[\u200c\u200d]]+(?=[\p{L}\p{M}])", regex.V1)
# These four show nothing wherever they are (a soft hyphen only at a line break the text no longer
# has; a BOM inside text is left from joined files) and no sequence needs them, unlike ZWJ in
# emoji or bidi marks around numbers: removed everywhere, in PDFs and text files alike.
_INVISIBLE = re.compile("[\u00ad\u200b\u2060\ufeff]")
# Characters that can spell text no reader sees (B25 in docs/REAL_WORLD_INPUTS.md): Unicode tags
# (U+E0000..U+E007F: "ASCII smuggling", each ASCII character + 0xE0000), the invisible math operators
# U+2061..U+2064 (StegCloak's alphabet), the deprecated format characters U+206A..U+206F,
# interlinear annotation marks, the Mongolian vowel separator, the Hangul fillers that render
# blank, the Khmer inherent vowels (which Unicode says not to use), shorthand and musical
# format controls, and the unassigned default-ignorable code points (which fonts draw as nothing).
# No text needs them: removed everywhere, and counted for the document's warnings. (Tags also
# spell the subdivision flags 🏴 England / Scotland / Wales: those become a black flag.)
_HIDDEN = re.compile("[\u115f\u1160\u17b4\u17b5\u180e\u2061-\u2064\u206a-\u206f\u3164\ufff0-\ufffb\uffa0"
                     "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e00ff\U000e01f0-\U000e0fff]")
# Zero-width steganography spells bits as runs of zero-width characters (and bidi controls, which
# show nothing either); spelling never needs two in a row of the first kind (with the soft hyphen
# and the combining grapheme joiner) or three of the second.
_ZERO_WIDTH_RUN = re.compile("[\u00ad\u034f\u200b-\u200d\u2060\ufeff]{2,}"
                             "|[\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]{3,}")
# A lone ZWNJ or ZWJ is spelling beside Persian, Indic or emoji characters; between ASCII
# characters (or spaces) it is one hidden bit.
_JOINER_IN_ASCII = re.compile("(?:(?<=[\x00-\x7f])|(?<!.))[\u200c\u200d](?=[\x00-\x7f]|(?!.))", re.S)
# Variation selectors (VS1-16, VS17-256, Mongolian free variation selectors) choose a glyph for
# the character before them: one after an emoji, a keycap digit, a CJK ideograph or a Mongolian
# letter is spelling; runs of them, or one after an ASCII character or a space, carry bytes
# ("emoji smuggling").
_SELECTORS = re.compile("(^|.)([\u180b-\u180d\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef]+)", re.S)
# Every character the four patterns above look for.
_MAY_HIDE = re.compile("[\u00ad\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
                       "\u3164\ufe00-\ufe0f\ufeff\ufff0-\ufffb\uffa0\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                       "\U000e0000-\U000e0fff]")
# Glyph ids printed as characters (a TrueType font without a Unicode map, "7KH" for "The"): ASCII
# symbols that prose never puts between two letters, or a digit before two capitals.
_MANGLED = regex.compile(r"\p{L}[\\\[\]{}|<=>;@$%*+#^~`]+\p{L}|\d\p{Lu}{2}")
_TOKEN = regex.compile(r"\S+")
_NOT_LETTER = regex.compile(r"[^\p{L}]")
_NEUTRAL = frozenset({"Zyyy", "Zinh", "Zzzz"})  # Common, Inherited, Unknown: not a script of their own
# Script families that mix within one word: Han, kana and Hangul in Japanese and Korean; Greek
# letters in Latin science writing (P15 "κNor", "ϕi"; P16 "πr").
_FAMILY = {"Hani": "CJK", "Hira": "CJK", "Kana": "CJK", "Hang": "CJK", "Bopo": "CJK",
           "Latn": "LatnGrek", "Grek": "LatnGrek"}
# Written without spaces between words: a long letter run is a sentence, not lost word breaks.
_UNSPACED = frozenset({"Hani", "Hira", "Kana", "Bopo", "Thai", "Laoo", "Khmr", "Mymr", "Tibt", "Yiii"})
_RTL = frozenset({"Arab", "Hebr", "Syrc", "Thaa", "Nkoo"})
_LATIN_VOWELS = frozenset("aeiouyAEIOUY")


def normalize_text(text: str) -> str:
    """Return `text` in the one form Halaman stores and tokenizes.

    - CRLF and lone CR → LF; NUL and other C0/C1 controls removed (\\n and \\t kept).
    - Noncharacters (U+FFFE, U+FFFF, U+FDD0..U+FDEF) and lone surrogates removed.
    - Invisible format characters (category Cf) between two letters removed, except ZWNJ/ZWJ;
      soft hyphen, zero-width space, word joiner and BOM removed anywhere; characters that can
      spell hidden text removed anywhere (`normalize_and_count`); other Cf characters outside
      words (ZWJ in emoji sequences, bidi marks) kept.
    - Latin ligatures U+FB00..U+FB06 spelled out ("ﬁ" → "fi"), then NFC, so that search and
      prefix-cache keys do not depend on how a PDF encoded a letter. Not NFKC: it would also
      rewrite superscripts, fractions and math letters.
    - Trailing spaces on a line removed, runs of blank lines collapsed to one, ends trimmed.
    Idempotent: normalize_text(normalize_text(s)) == normalize_text(s).
    """
    return normalize_and_count(text)[0]


def normalize_and_count(text: str) -> tuple[str, int]:
    """`normalize_text(text)` and how many of the characters it removed can hide text from a reader
    (Unicode tags, runs of zero-width characters or variation selectors, invisible operators:
    B25), for the loader's warning. A lone soft hyphen, zero-width space, word joiner or BOM,
    which editors and PDFs leave by accident, is removed without being counted."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _INVALID.sub("", text)
    hidden = 0
    while True:  # removing one character can make its neighbours a run, or leave a joiner among ASCII
        before = text
        text, removed = _remove_hidden(text)
        hidden += removed
        text = _INVISIBLE.sub("", _FORMAT_IN_WORD.sub("", text))
        text = unicodedata.normalize("NFC", text.translate(_LIGATURES))
        if text == before:
            break
    text = _TRAILING_SPACE.sub("\n", text)
    text = _MANY_BLANK_LINES.sub("\n\n", text)
    return text.strip(), hidden


def _remove_hidden(text: str) -> tuple[str, int]:
    """`text` without the characters that can spell hidden text, and how many there were."""
    if not _MAY_HIDE.search(text):
        return text, 0  # the common case, in one pass over the text
    length = len(text)
    text = _HIDDEN.sub("", text)
    text = _ZERO_WIDTH_RUN.sub("", text)
    text = _JOINER_IN_ASCII.sub("", text)
    text = _SELECTORS.sub(_selector, text)
    return text, length - len(text)


def _selector(match: re.Match[str]) -> str:
    base, selectors = match.group(1), match.group(2)
    if len(selectors) == 1 and base and not base.isspace() and (not base.isascii() or base in "0123456789#*"):
        return match.group()
    return base


@functools.lru_cache(maxsize=8192)
def scripts_of(char: str) -> frozenset[str]:
    """ISO 15924 codes of the scripts that use `char` (Unicode Script_Extensions, fontTools).

    Characters shared by several scripts belong to each of them: the prolonged sound mark "ー"
    to Hiragana and Katakana, the danda "।" to Devanagari, Bengali and others. Characters of no
    particular script (Common, Inherited without extensions) give an empty set.
    """
    return frozenset(script_extension(char)) - _NEUTRAL


def long_letter_runs(text: str, min_letters: int = LONG_RUN_LETTERS) -> list[str]:
    """Every run of at least `min_letters` letters with no space or punctuation inside, in
    scripts that separate words by spaces (a Thai or Chinese sentence is one run by design)."""
    return [word for word in _WORD.findall(text)
            if _letter_count(word) >= min_letters and not _unspaced(_scripts(word))]


def _letter_count(word: str) -> int:
    return len(word) if word.isascii() else len(word) - len(_MARK.findall(word))


def _scripts(word: str) -> frozenset[str]:
    """The scripts of a word's letters (marks take their letter's script)."""
    if word.isascii():
        return frozenset({"Latn"})
    found: set[str] = set()
    for char in _MARK.sub("", word):
        found |= scripts_of(char)
    return frozenset(found)


def _mixed(word: str) -> bool:
    """Whether a word's letters come from scripts that do not mix within words ("Hеllo" with a
    Cyrillic е). A letter shared by several scripts fits any of them."""
    if word.isascii():
        return False
    common: set[str] | None = None
    for char in _MARK.sub("", word):
        families = {_FAMILY.get(code, code) for code in scripts_of(char)}
        if not families:
            continue  # a letter of no script (mathematical letters, modifier letters)
        common = families if common is None else common & families
        if not common:
            return True
    return False


def _unspaced(scripts: frozenset[str]) -> bool:
    return bool(scripts) and scripts <= _UNSPACED | {"Hang"} and bool(scripts & _UNSPACED)


def _case_noise(word: str) -> bool:
    """A long run whose case flips like random glyph codes ("āĀċċĂĆąćĄČ"), not like glued words
    ("withJavawasstriking"): two or more capitals followed by a small letter, twice or more."""
    flips = sum(1 for a, b, c in zip(word, word[1:], word[2:]) if a.isupper() and b.isupper() and c.islower())
    return flips >= 2


def _is_wordlike(word: str, scripts: frozenset[str], letters: int) -> bool:
    """Heuristic "would a dictionary know this?": one script, plausible case, a vowel if Latin.

    Catches what broken fonts produce (P08's fake-bold "DDaattaa", P10's "ϲΒϴΒ", consonant soup
    from glyph-id text) without shipping a dictionary per language. Scripts without case and
    without spaces pass on the script test alone.
    """
    if _mixed(word) or letters >= LONG_RUN_LETTERS and not _unspaced(scripts):
        return False
    cased = word.lower() != word.upper()
    if cased and not (word.islower() or word.isupper() or (word[0].isupper() and word[1:].islower())):
        return False
    if scripts == {"Latn"} and letters > 1:
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
    glyph_names: int           # characters of "/g1/g2/g3" or "(cid:12)" runs: glyphs without Unicode
    wordlike_words: int        # words that pass the dictionary-like heuristic
    glyph_code_letters: int = 0  # letters of tokens that look like glyph ids printed as text
                                 # ("7KH", "O\\UH"), or long runs whose case flips at random
    latin_letters: int = 0       # letters of Latin-only words of 3+ letters
    latin_vowels: int = 0        # a e i o u y among them (accents removed)

    @property
    def latin_vowel_share(self) -> float:
        """Vowels among the letters of Latin words (1.0 without any). Prose in Latin-script
        languages has 30-45 %; glyph ids shifted into ASCII ("UHSRUW" for "report") about 15 %."""
        return self.latin_vowels / self.latin_letters if self.latin_letters else 1.0

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
                + self.mixed_script_letters + self.glyph_names + self.glyph_code_letters)

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
    cleaned = _GLYPH_NAMES.sub(" ", text)
    words = _WORD.findall(cleaned)
    glyph_codes = sum(len(_NOT_LETTER.sub("", token)) for token in _TOKEN.findall(cleaned) if _MANGLED.search(token))
    long_runs = long_run_letters = mixed = rtl = wordlike = letters = latin = vowels = 0
    for word in words:
        scripts = _scripts(word)
        n_letters = _letter_count(word)
        letters += n_letters
        if scripts == {"Latn"} and n_letters >= 3:  # not formula variables ("dx", "fg")
            latin += n_letters
            base = word if word.isascii() else unicodedata.normalize("NFD", word)
            vowels += sum(1 for ch in base if ch in _LATIN_VOWELS)
        if n_letters >= LONG_RUN_LETTERS and not _unspaced(scripts):
            long_runs += 1
            long_run_letters += n_letters
            if _case_noise(word):
                glyph_codes += n_letters
        if _mixed(word):
            mixed += n_letters
        if scripts & _RTL:
            rtl += n_letters
        if _is_wordlike(word, scripts, n_letters):
            wordlike += 1
    return TextQuality(
        chars=len(text) - whitespace, letters=letters, words=len(words), long_runs=long_runs,
        long_run_letters=long_run_letters, nul=nul, control=control,
        replacement=counts.get("\ufffd", 0), private_use=private_use, mixed_script_letters=mixed,
        rtl_letters=rtl, glyph_names=glyph_names, wordlike_words=wordlike,
        glyph_code_letters=glyph_codes, latin_letters=latin, latin_vowels=vowels,
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
"""...or where fewer than this share of its words look like words (with at least
UNRELIABLE_MIN_WORDS words).
Measured on the chosen text of every corpus page: word-like share is at least 0.77 (P15 page 46,
formulas) and garbage at most 5.4% (P15 page 15), so both limits leave a wide margin."""

UNRELIABLE_MIN_WORDS = 5
"""Fewer words than this say too little about a page (a figure label, a page number line)."""

UNRELIABLE_VOWEL_SHARE = 0.28
"""...or where Latin words (at least UNRELIABLE_MIN_LATIN letters of them) have fewer vowels than
this: glyph ids shifted into ASCII look like capitals with few vowels ("UHSRUW VKRZV", 22 %),
while prose has 35-45 % (Czech and Vietnamese in tests/test_text_quality.py: 39 %, 42 %; the
lowest corpus page, P15 page 100 with formulas: 33.5 %). Words under 3 letters are not counted."""

UNRELIABLE_MIN_LATIN = 40


def is_unreliable(quality: TextQuality) -> bool:
    """Whether text is too noisy to give the model: a font without a Unicode map, mojibake.

    Word-boundary loss alone never makes text unreliable (German compounds are long words).
    """
    if quality.chars == 0:
        return False
    return (quality.garbage / quality.chars >= UNRELIABLE_GARBAGE_SHARE
            or (quality.words >= UNRELIABLE_MIN_WORDS and quality.wordlike_share < UNRELIABLE_WORDLIKE_SHARE)
            or (quality.latin_letters >= UNRELIABLE_MIN_LATIN
                and quality.latin_vowel_share < UNRELIABLE_VOWEL_SHARE))
