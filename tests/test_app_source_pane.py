"""The source pane: a cited PDF page rendered by PDFium with the attended passages drawn over
their characters, a text file with the attended lines marked; clicking an answer's first source
in the real window (real model) shows the page that holds the answer, the needle highlighted."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import re  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import quote  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

import pypdfium2 as pdfium  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from app.source_pane import SourcePane, locate  # noqa: E402
from engine.attended import AttendedSpan  # noqa: E402
from engine.documents import load_document  # noqa: E402
from pdf_fixtures import helvetica_book  # noqa: E402
from test_app import anchors, ask, home, make_window, pick, wait_open  # noqa: E402,F401  (fixtures)
from window_driver import stream_answer, window_without_model  # noqa: E402
from test_span_recall import COMBINATION, NEEDLE_PAGE, QUESTION, book, settings  # noqa: E402

SENTENCE = f"Note: the combination of the observatory safe is {COMBINATION}."


def book_pdf(tmp_path: Path) -> Path:
    """tests/test_span_recall.py's book as a 24-page PDF, one sentence a line."""
    return helvetica_book(tmp_path / "book.pdf", [re.split(r"(?<=\.) ", s.text) for s in book().segments])


def sentence_box(pdf: Path, page: int, sentence: str) -> tuple[float, float, float, float]:
    """PDFium's (loose) bounding box of `sentence`'s characters on `page`: left, bottom, right, top."""
    document = pdfium.PdfDocument(str(pdf))
    try:
        text = document[page - 1].get_textpage()
        index, count = text.search(sentence).get_next()
        boxes = [text.get_charbox(i, loose=True) for i in range(index, index + count)]
    finally:
        document.close()
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def inside(box, outer, slack: float = 0.5) -> bool:
    return (box[0] >= outer[0] - slack and box[1] >= outer[1] - slack
            and box[2] <= outer[2] + slack and box[3] <= outer[3] + slack)


def test_locate_finds_a_passage_whatever_its_white_space():
    page = "First line.\r\nNote: the  combination\r\nof the safe."
    start, end = locate(page, "Note: the combination of the safe.")
    assert page[start:end] == "Note: the  combination\r\nof the safe."
    assert locate(page, "nothing like it at all here") is None
    twice = "Same line.\r\nOther.\r\nSame line.\r\n"
    assert locate(twice, "Same line.", near=17) == (20, 30), "the occurrence nearest the passage's own offset"
    assert locate(twice, "Same line.") == (0, 10)


def test_a_pdf_passage_is_drawn_over_its_characters_and_a_text_passage_marks_its_lines(qtbot, tmp_path):
    pdf = book_pdf(tmp_path)
    segment = load_document(pdf).segments[NEEDLE_PAGE - 1]
    start = segment.text.index(SENTENCE)
    other = segment.text.index("Engineers")
    passages = [AttendedSpan(NEEDLE_PAGE - 1, segment.label, NEEDLE_PAGE, None, start, start + len(SENTENCE), 0.5),
                AttendedSpan(NEEDLE_PAGE - 1, segment.label, NEEDLE_PAGE, None, other, other + 20, 0.1)]
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(500, 700)
    pane.show_pdf_page(pdf, NEEDLE_PAGE, passages, segment.text)
    qtbot.waitUntil(lambda: abs(pane.page_label.pixmap().width() - (pane.scroll.viewport().width() - 4)) <= 1)
    assert pane.page == NEEDLE_PAGE and pane.page_label.pixmap().width() > 200
    box = sentence_box(pdf, NEEDLE_PAGE, SENTENCE)
    strong = [r for r in pane.rectangles if r.passage == 0]
    assert strong and all(inside(r.box, box) for r in strong)
    assert max(r.alpha for r in pane.rectangles if r.passage == 1) < strong[0].alpha, "opacity follows the share"
    width = pane.page_label.pixmap().width()
    pane.zoom_in_button.click()
    assert pane.page_label.pixmap().width() > width
    pane.next_button.click()
    assert pane.current == 1

    text = "line one\nline two\nthe answer is here\nline four\n"
    at = text.index("the answer")
    pane.show_text_file(tmp_path / "notes.txt", text, [AttendedSpan(0, "notes.txt", None, None, at, at + 18, 0.7)])
    assert pane.marked_lines == [3] and pane.code.textCursor().blockNumber() == 2
    pane.show_text_file(tmp_path / "vault.py", "def secret():\n    return 58213\n", [])
    assert pane.marked_lines == []
    if _has_pygments():  # colours only where Pygments is installed
        assert any(f.format.foreground().color().name() != "#000000"
                   for f in pane.code.document().firstBlock().layout().formats()), "def is coloured"
    pane.close_button.click()
    assert not pane.isVisible()


def test_lines_after_emoji_are_marked_where_the_passage_is(qtbot, tmp_path):
    """Passages are code-point offsets; Qt counts UTF-16 units, two for each emoji before them."""
    text = "".join(f"note {i} \U0001f642\U0001f642\U0001f642\U0001f642\n" for i in range(30)) + "the answer is here\nlast\n"
    at = text.index("the answer")
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.show_text_file(tmp_path / "notes.txt", text, [AttendedSpan(0, "notes.txt", None, None, at, at + 18, 0.7)])
    assert pane.marked_lines == [31] and pane.code.textCursor().blockNumber() == 30


def test_a_passage_with_words_joined_across_line_ends_is_drawn_over_all_its_lines(qtbot, corpus):
    """B28: the segment text says "document" where the page prints "docu-" / "ment" (PDFium:
    "docu\ufffement"); the highlight still covers the sentence down to its last line."""
    pdf = next((corpus / "bugs").glob("B28-*")) / "hyphen.pdf"
    segment = load_document(pdf).segments[0]
    assert "document" in segment.text
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(500, 700)
    pane.show_pdf_page(pdf, 1, [AttendedSpan(0, segment.label, 1, None, 0, len(segment.text), 0.9)], segment.text)
    for word in ("committee", "budget"):
        left, bottom, right, top = sentence_box(pdf, 1, word)
        centre = ((left + right) / 2, (bottom + top) / 2)
        assert any(inside(centre * 2, r.box) for r in pane.rectangles), f"{word} is highlighted"


def _has_pygments() -> bool:
    try:
        import pygments  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_first_source_of_an_answer_opens_its_page_with_the_answer_highlighted(make_window, qtbot, tmp_path):
    pdf = book_pdf(tmp_path)
    window = make_window(settings())
    window.open_path(str(pdf))
    wait_open(qtbot, window)
    ask(qtbot, window, QUESTION)
    record = window.library.find(str(pdf.resolve()))
    message = window.library.messages(record.id)[-1]
    assert COMBINATION in message.text and message.sources[0].label == f"page {NEEDLE_PAGE}"
    assert not window.source_pane.isVisible()
    cursor = window.chat.textCursor()
    first_source = f"cite:{quote(message.sources[0].label)}#{message.id}"
    cursor.setPosition(anchors(window.chat)[first_source] + 1)
    qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
    pane = window.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=5_000)
    assert pane.page == NEEDLE_PAGE
    box = sentence_box(pdf, NEEDLE_PAGE, SENTENCE)
    assert any(inside(r.box, box) for r in pane.rectangles), (box, pane.rectangles, pane.passages)
    needle = [p for p in message.passages if p.segment_index == NEEDLE_PAGE - 1]
    assert pane.passages == needle

    # A later answer attends elsewhere; the first answer's source still shows the first answer's
    # passages (stored with it), not the latest answer's.
    ask(qtbot, window, "How many rusted bolts did the engineers find under the eastern railing of the bridge?")
    later = window.library.messages(record.id)[-1]
    assert later.id != message.id and [p for p in later.passages if p.segment_index == NEEDLE_PAGE - 1] != needle
    cursor.setPosition(anchors(window.chat)[first_source] + 1)
    qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
    assert pane.page == NEEDLE_PAGE and pane.passages == needle
    assert any(inside(r.box, box) for r in pane.rectangles), (box, pane.rectangles, pane.passages)


def test_the_first_source_of_an_answer_about_a_folder_opens_its_file_with_the_answer_line_marked(make_window, qtbot,
                                                                                                 tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    for i, segment in enumerate(book().segments, start=1):  # the same 24 pages as files, one sentence a line
        (folder / f"chapter_{i:02d}.md").write_text("\n".join(re.split(r"(?<=\.) ", segment.text)) + "\n")
    needle_file = f"chapter_{NEEDLE_PAGE:02d}.md"
    text = next(s.text for s in load_document(folder).segments if s.path == needle_file)
    needle_line = text[: text.index(SENTENCE)].count("\n") + 1
    window = make_window(settings())
    window.open_path(str(folder))
    wait_open(qtbot, window)
    ask(qtbot, window, QUESTION)
    message = window.library.messages(window.library.find(str(folder.resolve())).id)[-1]
    assert COMBINATION in message.text and message.sources[0].label == needle_file
    cursor = window.chat.textCursor()
    cursor.setPosition(anchors(window.chat)[f"cite:{quote(needle_file)}#{message.id}"] + 1)
    qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
    pane = window.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=5_000)
    assert pane.page is None and pane.code.toPlainText() == text
    assert needle_line in pane.marked_lines, (needle_line, pane.marked_lines, pane.passages)
    assert pane.code.textCursor().blockNumber() + 1 in pane.marked_lines, "scrolled to a marked line"


# ------------------------------------------------------------------------- issue 32
def click_link(qtbot, view, href: str) -> None:
    """Click the link `href` in a chat view, where it is drawn."""
    cursor = view.textCursor()
    cursor.setPosition(anchors(view)[href] + 1)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center())


def test_a_citation_in_another_documents_chat_shows_that_documents_page(make_window, qtbot, tmp_path):
    """Item 1: with one document open, a library document's chat is shown read-only; its answer's
    "page 2" is page 2 of *its* document, with its passage highlighted, not of the open one."""
    river = "The river in the first book is green."
    first = helvetica_book(tmp_path / "first.pdf", [["The first book opens here.", "It tells of a river."],
                                                    ["Its second page.", river, "Nothing else is said."]])
    second = helvetica_book(tmp_path / "second.pdf", [["The second book opens here.", "It tells of stones."],
                                                      ["Its second page too.", "The stones in the second book are grey.",
                                                       "Nothing more."]])
    window = make_window()
    window.open_path(str(first))
    wait_open(qtbot, window)
    first_id = window.state.open_id
    page_2 = window.state.document.segments[1]
    start = page_2.text.index(river)
    stream_answer(qtbot, window, first_id, "What colour is the river?", "The river is green [page 2].",
                  passages=[AttendedSpan(1, "page 2", 2, None, start, start + len(river), 0.8)])
    answer = window.library.messages(first_id)[-1]
    assert answer.passages, "the answer's passage is stored with it"

    window.open_path(str(second))
    wait_open(qtbot, window)
    second_id = window.state.open_id
    assert second_id != first_id
    pick(window, first_id)
    assert window.state.current.id == first_id and not window.state.is_open(window.state.current)
    click_link(qtbot, window.chat, f"cite:{quote('page 2')}#{answer.id}")
    pane = window.source_pane
    qtbot.waitUntil(lambda: pane.isVisible() and pane.page == 2, timeout=20_000)
    assert "first.pdf" in pane.title.text() and "second.pdf" not in pane.title.text()
    box = sentence_box(first, 2, river)
    assert pane.rectangles and all(inside(r.box, box) for r in pane.rectangles), (box, pane.rectangles)
    assert window.state.open_id == second_id, "showing a page reads nothing into the engine"

    # The open document's own citations still resolve in it.
    pick(window, second_id)
    window.chat.citation_clicked.emit("page 2", None)
    qtbot.waitUntil(lambda: "second.pdf" in pane.title.text(), timeout=5_000)
    assert pane.page == 2 and pane.rectangles == []


def test_previous_and_next_go_through_an_answers_passages_on_every_page(qtbot, tmp_path):
    """Item 3: an answer over several pages attended passages on each; Previous / Next go from one
    to the next across pages, and say why when there is nothing to step through."""
    pdf = book_pdf(tmp_path)
    document = load_document(pdf)
    needle = document.segments[NEEDLE_PAGE - 1]
    other_page = 3
    other = document.segments[other_page - 1]
    other_sentence = other.text[: other.text.index(".") + 1]
    start = needle.text.index(SENTENCE)
    passages = [AttendedSpan(NEEDLE_PAGE - 1, needle.label, NEEDLE_PAGE, None, start, start + len(SENTENCE), 0.5),
                AttendedSpan(other_page - 1, other.label, other_page, None, 0, len(other_sentence), 0.2)]
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(500, 700)
    pane.show_segment(document, NEEDLE_PAGE - 1, passages)
    assert pane.next_button.isEnabled() and pane.previous_button.isEnabled()
    assert "Passage 1 of 2" in pane.note.text() and f"page {other_page}" in pane.note.text()
    pane.next_button.click()
    assert pane.page == other_page and "Passage 2 of 2" in pane.note.text()
    box = sentence_box(pdf, other_page, other_sentence)
    assert pane.rectangles and all(inside(r.box, box) for r in pane.rectangles)
    pane.next_button.click()
    assert pane.page == NEEDLE_PAGE
    pane.previous_button.click()
    assert pane.page == other_page

    pane.show_segment(document, 0, passages)  # a page the answer did not attend: the others are named
    assert pane.next_button.isEnabled() and f"page {NEEDLE_PAGE}" in pane.note.text()
    pane.next_button.click()
    assert pane.page == NEEDLE_PAGE

    pane.show_segment(document, NEEDLE_PAGE - 1, passages[:1])
    assert not pane.next_button.isEnabled() and "nothing to step through" in pane.next_button.toolTip().lower()
    pane.show_segment(document, NEEDLE_PAGE - 1, [])
    assert not pane.previous_button.isEnabled() and "No highlights" in pane.note.text()
    assert "No highlights" in pane.previous_button.toolTip()


def test_the_code_pane_numbers_a_files_lines_as_on_disk(qtbot, tmp_path):
    """Item 5: runs of blank lines are collapsed in the text as read; the margin still shows the
    file's own line numbers."""
    from test_file_lines import NEEDLE, NEEDLE_ON_DISK, write_source

    path = write_source(tmp_path)
    document = load_document(path)
    segment = document.segments[0]
    start = segment.text.index(NEEDLE.strip())
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.show_segment(document, 0, [AttendedSpan(0, segment.label, None, None, start, start + 10, 0.5)])
    block = pane.code.textCursor().blockNumber()  # scrolled to the passage
    assert pane.marked_lines == [block + 1] and block + 1 < NEEDLE_ON_DISK
    assert pane.code.line_number(block) == NEEDLE_ON_DISK
    last = pane.code.blockCount() - 1
    assert pane.code.line_number(last) == len(path.read_text().rstrip("\n").split("\n"))


def test_a_source_pane_restored_open_at_start_is_empty_with_its_buttons_off(qtbot, home):
    """Item 8: the pane comes back open after a restart, with nothing in it: nothing to click."""
    window = window_without_model(qtbot)
    window.open_source_pane()
    assert window.source_pane.isVisible()
    window.close()
    again = window_without_model(qtbot)
    pane = again.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=5_000)
    assert not any(b.isEnabled() for b in (pane.previous_button, pane.next_button, pane.zoom_in_button, pane.zoom_out_button))
    assert "Click a page or file" in pane.note.text()
    again.close()


def test_a_file_whose_attention_is_spread_over_two_parts_opens_at_a_part_with_both_marked(smol, qtbot, home, tmp_path):
    """Issue 32 (window, second pass), item 1: an answer's attention on a file split half and half
    between two functions, each line too weak to be a passage alone. A click on the file's citation
    opened it at line 1 saying the answer attended nothing there; it opens at the first line of an
    attended part now, both parts marked."""
    from test_attended import spread_over_two_parts
    from window_driver import add_document, pick

    folder = tmp_path / "project"
    session, _sources, passages, (first, second) = spread_over_two_parts(smol, folder)
    window = window_without_model(qtbot)
    document_id = add_document(window, folder, session.document)
    pick(window, document_id)
    stream_answer(qtbot, window, document_id, "What do the parts add up?", "Weights times the factor [parts.py].",
                  passages=passages)
    answer = window.library.messages(document_id)[-1]
    click_link(qtbot, window.chat, f"cite:{quote('parts.py')}#{answer.id}")
    pane = window.source_pane
    qtbot.waitUntil(lambda: pane.isVisible() and pane.code.toPlainText() != "", timeout=20_000)
    assert "parts.py" in pane.title.text()
    assert "attended nothing" not in pane.note.text() and pane.note.text().startswith("Passage 1 of 3"), pane.note.text()
    assert set(first) | set(second) <= set(pane.marked_lines), pane.marked_lines
    assert pane.code.textCursor().blockNumber() + 1 == first[0], "half and half: the first part first"
    window.close()


@pytest.mark.parametrize("kind", ["pdf", "png"])
def test_a_recognised_page_is_highlighted_over_the_line_in_the_page_image(qtbot, tmp_path, monkeypatch, kind):
    """A scanned page (no text layer for PDFium to give boxes) and a photographed page: the
    attended sentence is drawn over its line of the image, from the recognised lines' boxes."""
    from scan_fixtures import PAGE_PX, line_box_px, scan_image, scan_pdf
    from test_documents_ocr import LEASE

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    if kind == "pdf":
        path, height = scan_pdf(tmp_path / "lease.pdf", [scan_image(LEASE)]), 792.0
    else:
        path, height = tmp_path / "lease.png", float(PAGE_PX[1])
        scan_image(LEASE).save(path)
    document = load_document(path)
    text = document.segments[0].text
    start = text.lower().find("the tenant pays")
    end = text.lower().find("euros") + len("euros")
    assert 0 <= start < end
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(700, 900)
    pane.show_segment(document, 0, [AttendedSpan(0, "page 1", 1, None, start, end, 0.8)])
    assert pane.rectangles and not pane.title.text().count("could not be rendered")
    units = height / PAGE_PX[1]  # page units per scan pixel
    top_px, bottom_px = line_box_px(1)
    for rect in pane.rectangles:
        left, bottom, right, top = rect.box
        assert height - (top_px - 15) * units >= top and bottom >= height - (bottom_px + 15) * units
