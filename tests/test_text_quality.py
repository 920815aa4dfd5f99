"""Text normalisation, quality measures, decoding, and the corpus quality table (bench script).
Case ids (P08, P10, …) name the test-corpus PDFs of docs/CORPUS.md."""

from __future__ import annotations

import codecs
import importlib.util
import sys
from pathlib import Path

import pytest

from engine.documents.encoding import Decoded, UnclearEncodingError, decode_bytes
from engine.documents.plain import looks_binary
from engine.documents.text import (
    is_unreliable, long_letter_runs, measure, normalize_text, same_content, scripts_of,
)

REPO = Path(__file__).resolve().parent.parent


# --- normalize_text -------------------------------------------------------------------------

def test_normalize_strips_nul_and_controls_but_keeps_newline_and_tab():
    assert normalize_text("a\x00b\x01c\x1fd\x7fe\x9ff\tg\nh") == "abcdef\tg\nh"


def test_normalize_line_endings_become_lf():
    assert normalize_text("one\r\ntwo\rthree\n") == "one\ntwo\nthree"


def test_normalize_spells_out_latin_ligatures_only():
    # P11 prints "ﬁlled"; NFKC would also turn km² into km2 and ℝ into R, which we keep.
    assert normalize_text("\ufb01lled \ufb00 \ufb03 km² ℝ ½") == "filled ff ffi km² ℝ ½"


def test_normalize_composes_to_nfc():
    assert normalize_text("Cafe\u0301") == "Café"


def test_normalize_removes_noncharacters_and_lone_surrogates():
    assert normalize_text("a\ufffeb\uffffc\ud800d") == "abcd"


def test_normalize_is_idempotent_and_trims_blank_runs():
    text = "  title  \n\n\n\nbody line   \n\n"
    once = normalize_text(text)
    assert once == "title\n\nbody line"
    assert normalize_text(once) == once


# --- measures -------------------------------------------------------------------------------

def test_long_runs_are_word_boundary_loss():
    # pypdf on P16 page 6, and PDFium on the same line.
    glued = "In 2003 I started teaching. The contrast withJavawasstrikingStudentsstruggled less"
    assert long_letter_runs(glued) == ["withJavawasstrikingStudentsstruggled"]
    assert long_letter_runs("The contrast with Java was striking.") == []


def test_measure_counts_each_kind_of_noise():
    quality = measure("a\x00b\x00 c\x03 \ufffd \ue000\uf8f1 good words here")
    assert (quality.nul, quality.control, quality.replacement, quality.private_use) == (2, 1, 1, 2)
    assert quality.garbage == 6


def test_mixed_script_words_count_but_greek_in_math_does_not():
    assert measure("Hеllo").mixed_script_letters == 5  # Cyrillic е inside a Latin word
    assert measure("κNor ϕi πr").mixed_script_letters == 0  # P15/P16 math notation


def test_wordlike_share_rejects_fake_bold_and_consonant_soup():
    assert measure("Series 026 Data Sheet Rotary Potentiometer").wordlike_share == 1.0
    assert measure("DDaattaa SShheeeett").wordlike_share == 0.0  # P08's faked bold
    assert measure("xkcd qwrt bcdf").wordlike_share == 0.0


def test_pypdf_glyph_names_are_garbage():
    quality = measure("/g1/g2/g3/g4/g5/g6")
    assert quality.glyph_names == 18
    assert is_unreliable(quality)
    assert measure("see /usr/bin/env and /home/dinsdale").glyph_names == 0


def test_unreliable_flags_noise_but_not_german_compounds():
    assert is_unreliable(measure("\x01\x04\x05\x06\x07\x08\x0e\x0f\x10 !\"#$%"))
    assert not is_unreliable(measure("2 Inhaltsverzeichnis\nStichwortverzeichnis 111"))
    assert not is_unreliable(measure("0 2 4 6 8\n0 2 4 6 8"))  # P14: digits only
    assert not is_unreliable(measure(""))


def test_score_prefers_text_with_word_boundaries():
    assert measure("with Java was striking").score > measure("withJavawasstrikingindeed").score


def test_same_content_ignores_whitespace_only():
    assert same_content("0 2 4 6 8\n0\n2", "0\n2\n4\n6\n8\n02")
    assert not same_content("0 2 4", "0 2 5")


# --- text reliability across writing systems ---------------------------------------------------
# Real sentences: every one must be reliable text with a clean score. Garbage: what fonts without a
# Unicode map, broken decoders and lookalike letters produce; every one must be flagged.

SENTENCES = {  # at least 12 writing systems
    "Latin (English)": "The library opens at nine and closes at six on weekdays, except on public holidays.",
    "Latin (Czech)": "Příliš žluťoučký kůň úpěl ďábelské ódy a čtvrť se bála, že přijde bouřka.",
    "Latin (Vietnamese)": "Tiếng Việt là ngôn ngữ chính thức của Việt Nam và được hơn chín mươi triệu người sử dụng.",
    "Greek": "Η Ελλάδα είναι χώρα της νοτιοανατολικής Ευρώπης. Πρωτεύουσα και μεγαλύτερη πόλη είναι η Αθήνα.",
    "Cyrillic": "Москва является столицей Российской Федерации и крупнейшим городом страны по численности населения.",
    "Arabic": "اللغة العربية هي إحدى أكثر اللغات انتشارا في العالم، ويتحدثها أكثر من أربعمائة مليون شخص.",
    "Hebrew": "העברית היא שפה שמית ממשפחת השפות האפרו-אסיאתיות, והיא השפה הרשמית של מדינת ישראל.",
    "Devanagari": "हिन्दी भारत की एक प्रमुख भाषा है और इसे देवनागरी लिपि में लिखा जाता है। यह करोड़ों लोगों की मातृभाषा है।",
    "Thai": "ภาษาไทยเป็นภาษาราชการของประเทศไทย และเป็นภาษาที่มีวรรณยุกต์ ผู้คนหลายล้านคนใช้ภาษานี้ทุกวัน",
    "Chinese": "中华人民共和国位于东亚，是世界上人口最多的国家之一。首都是北京，最大的城市是上海。",
    "Japanese": "私は昨日コンピューターでメールを送りました。ホテルのレストランでコーヒーを飲みながら、ニュースを読みました。",
    "Korean": "한국어는 대한민국과 조선민주주의인민공화국의 공용어이며, 약 칠천칠백만 명이 사용하는 언어입니다.",
    "Georgian": "საქართველო არის სახელმწიფო ამიერკავკასიაში, შავი ზღვის აღმოსავლეთ სანაპიროზე. დედაქალაქი თბილისია.",
    "Armenian": "Հայաստանը լեռնային երկիր է Հարավային Կովկասում, և նրա մայրաքաղաքը Երևանն է։",
}
GARBAGE = {
    "shifted glyph codes (Latin)": "7KH TXDUWHUO\\ UHSRUW VKRZV VWHDG\\ JURZWK LQ DOO UHJLRQV\x11 5HYHQXH URVH E\\ WZHOYH SHUFHQW",
    "shifted glyph codes, no spaces": "7KHTXDUWHUO\\UHSRUWVKRZVVWHDG\\JURZWKLQDOOUHJLRQV\x115HYHQXHURVHE\\WZHOYH",
    "glyph ids as Latin Extended-A": "āĀċċĂĆąćĄČąĉēĔďąđĈĐČčđĉčąČąđčċĉĊăĐĀĒďĔĎĈĐ",
    "private-use run": "\ue010\ue011\ue012\ue013 \ue014\ue015\ue016 \ue017\ue018\ue019\ue01a \ue01b",
    "control characters": "\x01 \x04\x05\x06 \x07\x08\t\x06\n \x0b\x0c\r\x06 \x0e\x0f\x10 \t\x11\x0e\n\x11\x06\t\x06",
    "mixed-script noise": "Нellо Wоrld Тhis іs а tеst оf mіxеd sсrірt Нellо Wоrld аgаin",
    "pdfminer cids": "(cid:1)(cid:2)(cid:3) (cid:4)(cid:5) (cid:6)(cid:7)(cid:8)(cid:9)",
    "fake bold and consonant soup": "DDaattaa SShheeeett xkcd qwrt bcdf zxcv plmk jhgf trwq",
}


@pytest.mark.parametrize("name", SENTENCES)
def test_real_sentences_in_every_script_are_reliable(name):
    quality = measure(SENTENCES[name])
    assert not is_unreliable(quality), quality
    assert quality.garbage == 0 and quality.long_runs == 0
    assert quality.score >= 0.9  # Czech: one vowelless word ("čtvrť") of 13


@pytest.mark.parametrize("name", GARBAGE)
def test_garbage_of_every_kind_is_unreliable(name):
    assert is_unreliable(measure(GARBAGE[name]))


def test_shared_characters_belong_to_the_scripts_that_use_them():
    assert scripts_of("ー") == {"Hira", "Kana"}  # prolonged sound mark: Common, used in kana words
    assert "Deva" in scripts_of("\u0964")        # danda
    assert scripts_of("!") == frozenset()          # Common, used by every script: none of its own
    assert {"Latn", "Grek", "Cyrl"} <= scripts_of("\u0301")  # combining acute (Inherited + extensions)
    assert measure("コンピューター").mixed_script_letters == 0


def test_format_characters_between_letters_are_removed_elsewhere_kept():
    assert normalize_text("Ge\u00adschwin\u200bdig\u2060keit") == "Geschwindigkeit"
    # these four show nothing anywhere; a bidi mark outside a word is kept
    assert normalize_text("\u200bstart \ufeffend\u00ad \u2060x") == "start end x"
    assert normalize_text("\u200f(1)") == "\u200f(1)"
    assert normalize_text("می\u200cخواهم") == "می\u200cخواهم"  # ZWNJ is Persian spelling
    assert normalize_text("👩\u200d💻") == "👩\u200d💻"  # an emoji sequence, not letters


# --- decoding and binary sniffing -----------------------------------------------------------

def test_decode_prefers_bom_then_utf8_then_a_detected_code_page():
    assert decode_bytes("über".encode("utf-16")) == Decoded("über")
    assert decode_bytes(codecs.BOM_UTF8 + "ß".encode()) == Decoded("ß")
    assert decode_bytes("Café".encode()) == Decoded("Café")
    # too short for the detector's language model: cp1252, which gives the same text as its guess
    assert decode_bytes("Café “q”".encode("cp1252")) == Decoded("Café “q”", fallback="cp1252")
    assert decode_bytes("Café crème brûlée".encode("latin-1")) == Decoded("Café crème brûlée", fallback="cp1252")
    # short, undefined in cp1252 (0x81), and eight code pages fit: no guess is given to the model
    with pytest.raises(UnclearEncodingError, match="best guess"):
        decode_bytes(b"caf\xe9 \x81")
    with pytest.raises(UnclearEncodingError, match="cp1251"):
        decode_bytes("Привет, мир".encode("cp1251"))


def test_multibyte_char_cut_by_the_window_is_not_binary():
    data = ("a" * 1023 + "リスト").encode()
    assert not looks_binary(data[:1024])  # ends inside a 3-byte character (gitingest #578)


def test_nul_anywhere_in_window_is_binary_unless_utf16():
    assert looks_binary(b"# header text\n" * 200 + b"\x00\x01")
    assert not looks_binary("text with BOM".encode("utf-16"))
    assert looks_binary(bytes(range(1, 32)) * 20)


# --- the corpus table -----------------------------------------------------------------------

def _bench():
    spec = importlib.util.spec_from_file_location("pdf_text_quality", REPO / "bench" / "pdf_text_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pdf_text_quality", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def quality_rows(corpus):
    """The bench's measurements over the whole corpus (pypdf runs over P16 once, here)."""
    bench = _bench()
    rows = bench.collect(corpus)
    return bench, {(row.file, row.extractor): row for row in rows}, rows


def test_quality_table_is_printed_and_shows_the_fix(quality_rows, capsys):
    bench, by_key, rows = quality_rows
    with capsys.disabled():  # show the table in every CI log, not only on failure
        print("\n\nPDF text quality over the corpus (bench/pdf_text_quality.py):")
        print(bench.table(rows))
    p16 = {name: by_key["P16", name] for name in bench.EXTRACTORS}
    assert p16["pypdf"].run_pages > 100  # the bug: 148 of 288 pages
    assert p16["pdfium"].run_pages == 0
    assert p16["halaman"].run_pages == 0
    assert p16["halaman"].pages == 288
    assert by_key["P15", "pypdf"].nul == 527
    assert all(row.nul == 0 and row.control == 0 for row in rows if row.extractor == "halaman")
    # The per-page choice is never worse than PDFium alone, and fixes P10 (reversed Arabic).
    totals = {row.extractor: row for row in bench.totals(rows)}
    halaman, pdfium = totals["halaman"], totals["pdfium"]
    assert halaman.score_sum >= pdfium.score_sum
    assert by_key["P10", "halaman"].score_sum > by_key["P10", "pdfium"].score_sum
