"""Spaces between words from the recogniser's character positions (OCR).

PP-OCR's recogniser reads a text line as a sequence of columns (one per 8 pixels of the line
scaled to 48 pixels high) and gives each column a probability for every character, a "blank"
and a space; CTC decoding keeps the best character of each column, drops blanks and repeats
(Graves et al., ICML 2006). In small, dense print (a 10-K's 9-point body text) the space column
between two words often loses to a blank, so rapidocr's decoder writes "AccountingforContract".
`decode_line` decodes the same way and then puts back a space between two characters where the
line itself says there is one:

- the space was *heard*: some column between the two characters gives the space at least
  `SPACE_HEARD` probability (the recogniser saw a space, a blank only scored higher), or
- the gap is *wide*: the columns between the two characters' peaks are at least `WIDE_GAP` times
  the line's usual gap (the median over its neighbouring characters), a rule from the line's own
  statistics, so large and small print, wide and narrow fonts are judged alike. The recogniser's
  columns are coarse (a letter is 2-3 of them), so this rule only catches gaps of several letters;
  the heard space does the work in running text.

No OCR engine is imported here: the functions take the recogniser's per-column arrays, so they
are tested without it (engine.documents.ocr_worker feeds them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPACE_HEARD = 0.01
"""Least probability of the space in a column between two characters that counts as a space
there. On six 300-dpi pages (a book, a legal summary, four 10-Ks) 0.005-0.02 gave CER 0.84-0.94 %
against 4.22 % without added spaces; 0.1 gave 1.95 % (docs/BENCHMARKS.md §12)."""

WIDE_GAP = 3.0
"""A gap between two characters' columns at least this many times the line's median gap is a
space, whatever the space's probability: a gap as wide as a few letters (table cells read as one
line). Columns are whole numbers and a line's median gap is 2 or 3, so a tighter factor mistakes
wide letters for spaces: 1.7 gave CER 1.59 % against 0.86 % with heard spaces alone, while 3.0
changed nothing on the same pages."""

HALF_WIDTH = str.maketrans({chr(0xFF01 + i): chr(0x21 + i) for i in range(94)} | {"\u3000": " "})
"""Full-width forms (U+FF01-FF5E, the ideographic space) to their ASCII letters: the PP-OCR model's
dictionary is Chinese and English, and it sometimes writes a Latin comma or colon as its
full-width twin ("，"), which a search for "1,200" would not find."""

MIN_GAPS = 4
"""Fewer gaps than this in a line give no usual gap to compare with: only heard spaces are added."""


def decode_line(best: np.ndarray, confidence: np.ndarray, space_probability: np.ndarray,
                characters: Sequence[str], *, blank: int = 0) -> tuple[str, float]:
    """One line's text and score from its recogniser output.

    best: [columns] int, the most probable class of each column (`blank` = CTC blank);
    confidence: [columns] float, that class's probability; space_probability: [columns] float,
    the space class's probability; characters: class index -> character (" " is the space).
    Returns (text, score): the CTC decoding (repeats merged, blanks dropped) with spaces added
    where `space_after` finds them and full-width forms made ASCII (HALF_WIDTH), and the mean confidence of the decoded characters (0.0 for an
    empty line), as rapidocr scores a line. Raises ValueError when the arrays differ in length."""
    if not len(best) == len(confidence) == len(space_probability):
        raise ValueError("best, confidence and space_probability must have one value per column")
    keep = best != blank
    keep[1:] &= best[1:] != best[:-1]
    columns = np.flatnonzero(keep)
    if not len(columns):
        return "", 0.0
    chars = [characters[int(index)] for index in best[columns]]
    score = float(np.mean(confidence[columns]))
    spaces = space_after(chars, columns.tolist(), space_probability)
    text = "".join(char + (" " if added else "") for char, added in zip(chars, spaces))
    return " ".join(text.translate(HALF_WIDTH).split()), score


def space_after(chars: Sequence[str], columns: Sequence[int], space_probability: np.ndarray) -> list[bool]:
    """For each of `chars` (decoded characters at `columns`, left to right), whether a space the
    decoder dropped belongs after it: heard (SPACE_HEARD) or wide (WIDE_GAP × the line's median
    gap between neighbouring non-space characters). A character followed by a decoded space, or
    the last one, gets False (nothing to add)."""
    pairs = [k for k in range(len(chars) - 1) if chars[k] != " " and chars[k + 1] != " "]
    gaps = [columns[k + 1] - columns[k] for k in pairs]
    usual = float(np.median(gaps)) if len(gaps) >= MIN_GAPS else None
    added = [False] * len(chars)
    for k, gap in zip(pairs, gaps):
        between = space_probability[columns[k] + 1:columns[k + 1]]
        heard = len(between) > 0 and float(between.max()) >= SPACE_HEARD
        wide = usual is not None and gap >= WIDE_GAP * usual
        added[k] = heard or wide
    return added
