"""Text files in every encoding people have (B15 in docs/REAL_WORLD_INPUTS.md): legacy Windows
code pages detected, UTF-16 without a byte-order mark, UTF-8 with a few bad bytes, and a clear
error instead of mojibake where no code page is sure; invisible format characters normalised the
same way as in PDFs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdf_fixtures import truetype_pdf

from engine.documents import NotTextError, load_document
from engine.documents.text import normalize_text

RUSSIAN = ("Протокол совещания\n\nРезервное копирование базы данных выполняется каждую ночь в два часа.\n"
           "Бюджет на следующий квартал составляет один миллион двести тысяч рублей.\n")
CHINESE = "会议纪要\n一、数据库备份每天凌晨两点执行，保留十四份每日备份。\n二、下季度预算为一百二十万元。\n"
ENGLISH = "Meeting notes\n\nThe database backup runs every night at 02:00.\n"


def bug(corpus: Path, case: str) -> Path:
    return next((corpus / "bugs").glob(f"{case}-*"))


def text_of(path: Path) -> str:
    document = load_document(path)
    assert len(document.segments) == 1
    return document.segments[0].text


def test_b15_gbk_minutes_give_the_text_of_the_utf8_control(corpus):
    folder = bug(corpus, "B15")
    document = load_document(folder / "minutes-gbk.txt")
    assert document.segments[0].text == text_of(folder / "minutes-utf8.txt")
    assert "数据库备份" in document.segments[0].text
    assert document.warnings == ["decoded with fallback (gb18030): minutes-gbk.txt"]


def test_b15_shift_jis_minutes_give_their_japanese_text(corpus):
    path = bug(corpus, "B15") / "minutes-shift_jis.txt"
    text = text_of(path)
    assert text == normalize_text(path.read_bytes().decode("shift_jis"))  # the control: decoded knowing the codec
    assert "データベースのバックアップ" in text


def test_cp1251_russian_file_is_detected(tmp_path):
    path = tmp_path / "протокол.txt"
    path.write_bytes(RUSSIAN.encode("cp1251"))
    document = load_document(path)
    assert document.segments[0].text == RUSSIAN.strip()
    assert document.warnings == ["decoded with fallback (cp1251): протокол.txt"]


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("text", [ENGLISH, CHINESE], ids=["english", "chinese"])
def test_utf16_without_a_byte_order_mark_is_recognised(tmp_path, codec, text):
    """NUL bytes made these "binary"; both byte orders decode strictly, and the wrong one gives
    unassigned code points for the line feeds."""
    path = tmp_path / "notes.txt"
    path.write_bytes(text.encode(codec))
    document = load_document(path)
    assert document.segments[0].text == text.strip() and document.warnings == []


def test_utf8_file_with_a_few_bad_bytes_keeps_its_utf8(tmp_path):
    """One "é" typed in a Latin-1 editor and one stray byte: only those spans change; the file is
    not re-read as cp1252 (which turned every "ü" of the UTF-8 into "Ã¼")."""
    path = tmp_path / "notes.md"
    path.write_bytes("Größe: über 5 m², Übergang.\n".encode() + b"Caf\xe9 \x81 ok\n")
    document = load_document(path)
    assert document.segments[0].text == "Größe: über 5 m², Übergang.\nCafé \ufffd ok"
    assert document.warnings == ["2 bytes not UTF-8 replaced: notes.md"]


def test_unclear_encoding_is_one_error_naming_the_guesses(tmp_path):
    """Eleven Cyrillic letters fit eight code pages: no decoding is given to the model."""
    path = tmp_path / "hello.txt"
    path.write_bytes("Привет, мир".encode("cp1251"))
    with pytest.raises(NotTextError) as info:
        load_document(path)
    message = str(info.value)
    assert message.startswith("hello.txt: the text encoding is not clear (best guess ")
    assert "cp1251" in message and message.endswith("save it as UTF-8 and open it again")
    assert "\n" not in message


def test_encodings_inside_a_folder(tmp_path, corpus):
    (tmp_path / "minutes-gbk.txt").write_bytes((bug(corpus, "B15") / "minutes-gbk.txt").read_bytes())
    (tmp_path / "ru.txt").write_bytes(RUSSIAN.encode("cp1251"))
    (tmp_path / "utf16.txt").write_bytes(ENGLISH.encode("utf-16-le"))
    (tmp_path / "hello.txt").write_bytes("Привет, мир".encode("cp1251"))
    document = load_document(tmp_path)
    text = {segment.path: segment.text for segment in document.segments}
    assert "数据库备份" in text["minutes-gbk.txt"] and text["ru.txt"] == RUSSIAN.strip()
    assert text["utf16.txt"] == ENGLISH.strip() and "hello.txt" not in text
    assert "decoded with fallback (gb18030): minutes-gbk.txt" in document.warnings
    assert any(w.startswith("skipped (encoding not clear, best guess ") and w.endswith("): hello.txt")
               for w in document.warnings)


def test_invisible_format_characters_are_normalised_alike_in_text_files_and_pdfs(tmp_path):
    line = "Die Ge\u00adschwin\u200bdigkeit, \ufeffder Ver\u2060trag."
    text_file = tmp_path / "line.txt"
    text_file.write_text(line, encoding="utf-8")
    pdf = truetype_pdf(tmp_path / "line.pdf", [line])
    assert text_of(text_file) == text_of(pdf) == "Die Geschwindigkeit, der Vertrag."


def test_a_log_padded_with_nul_bytes_after_a_crash_is_read_as_text(tmp_path):
    """Issue 45 minor: a log a crash left with 64 KiB of NUL bytes at its end was refused as binary."""
    lines = b"".join(b"2024-05-03 02:%02d:00 INFO backup step %d done\n" % (k, k) for k in range(40))
    log = tmp_path / "service.log"
    log.write_bytes(lines + b"2024-05-03 02:41:00 ERROR disk full\n" + b"\x00" * 65536)
    document = load_document(log)
    assert document.segments[0].text.endswith("ERROR disk full") and "\x00" not in document.render()
    assert document.warnings == ["65,536 NUL bytes at the end left out (padding a crash or a preallocating writer left): service.log"]
    # a NUL before the padding still means binary, and a file of NULs is not text
    (tmp_path / "mixed.log").write_bytes(b"text\x00more text\n" + b"\x00" * 100)
    (tmp_path / "zeros.bin").write_bytes(b"\x00" * 4096)
    for name in ("mixed.log", "zeros.bin"):
        with pytest.raises(NotTextError):
            load_document(tmp_path / name)
