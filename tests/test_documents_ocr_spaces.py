"""Spaces between words put back from the recogniser's character positions
(engine.documents.ocr_spaces): decoded from made-up recogniser columns against rapidocr's own
decoder, and read from a page of small, dense print rendered in the test by the real OCR engine."""

from __future__ import annotations

import numpy as np
import pytest

from engine.documents.ocr_spaces import SPACE_HEARD, decode_line, space_after

CHARACTERS = ["blank", *"abcdefghijklmnopqrstuvwxyz,.，：", " "]
BLANK, SPACE = 0, len(CHARACTERS) - 1


def columns(spec: list[tuple[str, float]]) -> np.ndarray:
    """Recogniser output [columns, classes] (softmax-like rows): each (what, p) is one column
    whose best class is `what` ("" = blank) with probability `p`, the space taking the rest when
    `what` is blank (a space the decoder drops, heard a little)."""
    probs = np.zeros((len(spec), len(CHARACTERS)), dtype=np.float32)
    for row, (what, p) in enumerate(spec):
        best = CHARACTERS.index(what) if what else BLANK
        probs[row, best] = p
        probs[row, SPACE if best == BLANK else BLANK] = 1 - p
    return probs


def decode(probs: np.ndarray) -> str:
    return decode_line(probs.argmax(1), probs.max(1), probs[:, SPACE], CHARACTERS)[0]


def rapidocr_decode(probs: np.ndarray) -> str:
    """rapidocr's decoder (CTCLabelDecode) on the same columns: what the app read before."""
    utils = pytest.importorskip("rapidocr_onnxruntime.ch_ppocr_rec.utils")
    decoder = utils.CTCLabelDecode(character=CHARACTERS[1:-1])
    assert decoder.character == CHARACTERS
    return decoder(probs[np.newaxis])[0][0]


def word(text: str, gap: int = 2) -> list[tuple[str, float]]:
    """A word's columns: each letter then `gap - 1` blanks the space does not touch."""
    return [spec for char in text for spec in [(char, 0.99)] + [("", 1.0)] * (gap - 1)]


def test_a_space_the_decoder_dropped_but_heard_is_put_back():
    probs = columns(word("accounting") + [("", 1 - 2 * SPACE_HEARD)] + word("for") + [("", 0.7)] + word("contract"))
    assert rapidocr_decode(probs) == "accountingforcontract"
    assert decode(probs) == "accounting for contract"


def test_a_gap_much_wider_than_the_lines_usual_gap_is_a_space_even_unheard():
    probs = columns(word("total") + [("", 1.0)] * 4 + word("revenue"))  # 6 columns against 2
    assert rapidocr_decode(probs) == "totalrevenue"
    assert decode(probs) == "total revenue"


def test_even_letters_and_faint_space_scores_inside_a_word_stay_together():
    probs = columns(word("statements") + [("", 1 - SPACE_HEARD / 4)] + word("net"))
    assert decode(probs) == rapidocr_decode(probs) == "statementsnet"


def test_spaces_the_decoder_kept_are_kept_once_and_repeats_merge_as_in_ctc():
    probs = columns([("a", 0.9), ("a", 0.9), ("", 1.0), ("a", 0.9), (" ", 0.9), ("", 1.0), ("b", 0.9)])
    assert decode(probs) == rapidocr_decode(probs) == "aa b"
    assert space_after(["a", " ", "b"], [0, 4, 6], np.zeros(8)) == [False, False, False]


def test_columns_and_scores_must_match_in_length():
    with pytest.raises(ValueError):
        decode_line(np.zeros(3, dtype=int), np.zeros(2), np.zeros(3), CHARACTERS)


NOTES = ["The preparation of financial statements in conformity with accounting principles generally accepted in the",
         "United States requires management to make estimates and assumptions that affect the amounts reported in",
         "the consolidated financial statements and accompanying notes. We base our estimates on historical experience"]


@pytest.mark.parametrize("font_px", [15, 17])
def test_small_dense_print_is_read_with_its_spaces_and_one_box_per_line(tmp_path, monkeypatch, font_px):
    """A 10-K's notes set small and tight (Pillow's scalable font at 15 and 17 px, lines as wide as
    a page scaled to the recogniser's 2,000 px): rapidocr's own decoder reads most of it as
    "Thepreparationoffinancialstatements..."; read as the app reads an image, every word is
    separate and each line keeps its own box for the source pane."""
    from PIL import Image, ImageDraw, ImageFont

    from engine.documents import load_document
    from engine.documents.ocr import cached_page

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    step = int(font_px * 1.5)
    image = Image.new("L", (1545, 60 + len(NOTES) * step), 255)
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(NOTES):
        draw.text((60, 30 + number * step), line, fill=0, font=ImageFont.load_default(size=font_px))
    path = tmp_path / "notes.png"
    image.save(path)
    document = load_document(path)
    assert document.segments[0].text.split() == " ".join(NOTES).split(), document.segments[0].text
    page = cached_page(path, 0)
    assert [line.text for line in page.lines] == NOTES
    tops = [30 + number * step for number in range(len(NOTES))]
    for line, top in zip(page.lines, tops):
        left, bottom, right, box_top = line.box
        assert box_top >= image.height - top - font_px and bottom <= image.height - top, (line, top)


def test_full_width_punctuation_from_the_chinese_dictionary_is_made_ascii():
    probs = columns(word("north") + [("，", 0.9), ("", 1.0)] + word("south") + [("：", 0.9)])
    assert rapidocr_decode(probs) == "north，south："
    assert decode(probs) == "north,south:"
