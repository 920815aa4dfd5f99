"""Pages named as printed (issue 44): a PDF whose /PageLabels number its front matter i, ii, iii
and its body from 1 is cited as "page iii (PDF page 3)" and "page 1 (PDF page 4)" in the answer's
sources, the window's source list and source pane, `halaman find` and the export, while the
physical page stays the key (the segment's label, the marker the model reads, the page shown)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import quote  # noqa: E402

import pypdf  # noqa: E402
import pytest  # noqa: E402

from engine.attended import AttendedSpan  # noqa: E402
from engine.cli import main as cli_main  # noqa: E402
from engine.documents import load_document  # noqa: E402
from engine.documents.document import MAX_LABEL_CHARS  # noqa: E402
from pdf_fixtures import helvetica_book  # noqa: E402
from test_cli import run  # noqa: E402
from test_span_recall import NEEDLE_PAGE, QUESTION, book, settings  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from test_app import anchors, ask, home, make_window, wait_open  # noqa: E402,F401  (fixtures)

KEEPER = "The lighthouse keeper counted nine hundred gulls on the northern rocks."


def labelled(path: Path, pages: list[list[str]], front: int, prefix: str = "") -> Path:
    """`pages` as a PDF (`helvetica_book`) whose first `front` pages are labelled i, ii, … and the
    rest 1, 2, … (`prefix` before each body number), as pypdf writes /PageLabels."""
    plain = helvetica_book(path.with_name(path.stem + "-plain.pdf"), pages)
    writer = pypdf.PdfWriter(clone_from=str(plain))
    writer.set_page_label(0, front - 1, style="/r")
    writer.set_page_label(front, len(pages) - 1, style="/D", prefix=prefix or None)
    writer.write(str(path))
    return path


def little_book(tmp_path: Path) -> Path:
    pages = [["Preface of the coast guide."], ["Contents of the coast guide."], ["Acknowledgements to the crew."],
             ["Chapter one: the coast.", KEEPER], ["Chapter two: the harbour and its tides."]]
    return labelled(tmp_path / "coast.pdf", pages, front=3)


def test_a_pdf_s_page_labels_name_its_pages_and_the_physical_page_stays_the_key(tmp_path):
    document = load_document(little_book(tmp_path))
    assert [s.label for s in document.segments] == [f"page {n}" for n in range(1, 6)]  # the key, unchanged
    assert [s.shown for s in document.segments] == ["page i (PDF page 1)", "page ii (PDF page 2)",
                                                    "page iii (PDF page 3)", "page 1 (PDF page 4)",
                                                    "page 2 (PDF page 5)"]
    assert "[page 4]" in document.render() and "PDF page" not in document.render()  # the model reads the same text
    assert document.shown_labels()["page 4"] == "page 1 (PDF page 4)"


def test_a_pdf_without_labels_or_labelled_as_numbered_names_pages_as_before(tmp_path):
    plain = load_document(helvetica_book(tmp_path / "plain.pdf", [["One."], ["Two."]]))
    assert [s.shown for s in plain.segments] == ["page 1", "page 2"] and plain.shown_labels() == {}
    same = tmp_path / "same.pdf"
    writer = pypdf.PdfWriter(clone_from=str(tmp_path / "plain.pdf"))
    writer.set_page_label(0, 1, style="/D")
    writer.write(str(same))
    assert [s.shown for s in load_document(same).segments] == ["page 1", "page 2"]


def test_a_hostile_page_label_is_cut_and_kept_on_one_line(tmp_path):
    long_prefix = "A" * 500 + "\n\u202e"
    document = load_document(labelled(tmp_path / "long.pdf", [["Front."], ["Body text here."]], front=1,
                                      prefix=long_prefix))
    printed = document.segments[1].printed
    assert printed is not None and len(printed) <= MAX_LABEL_CHARS and "\n" not in printed, printed


def test_halaman_find_names_pages_as_printed(tmp_path):
    pdf = little_book(tmp_path)
    out = run("find", str(pdf), "How many gulls did the lighthouse keeper count?")
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"read\s+page 1 \(PDF page 4\)", out.stdout), out.stdout


def test_the_export_names_cited_and_quoted_pages_as_printed(home, tmp_path, capsys):
    from engine.library import Library
    from engine.workspace import passages_json

    pdf = little_book(tmp_path)
    document = load_document(pdf)
    segment = document.segments[3]
    start = segment.text.index(KEEPER)
    library = Library(interrupt_streaming=False)
    document_id = library.upsert_document(path=str(pdf.resolve()), title=document.title, kind="pdf", pages=5)
    library.add_message(document_id, "user", "How many gulls?")
    library.add_message(document_id, "assistant", "Nine hundred [page 4]; the preface [page 3].", model="SmolLM2",
                        passages_json=passages_json([AttendedSpan(3, "page 4", 4, None, start,
                                                                  start + len(KEEPER), 0.7)]))
    library.close()
    assert cli_main(["history", "export", str(pdf)]) == 0
    text = capsys.readouterr().out
    title = document.title
    assert f"Nine hundred [{title}, page 1 (PDF page 4)]; the preface [{title}, page iii (PDF page 3)]." in text
    assert f"> “{KEEPER}” — [{title}, page 1 (PDF page 4)] (70 %)" in text


def test_the_window_names_the_attended_page_as_printed_and_its_pane_too(make_window, qtbot, tmp_path):
    """Real window, real model: the answer's attended page and the source pane's header name the
    page as printed ("page 13 (PDF page 17)": the book's first four pages are its front matter);
    the link still opens physical page 17."""
    from PySide6.QtCore import Qt

    pages = [re.split(r"(?<=\.) ", s.text) for s in book().segments]
    pdf = labelled(tmp_path / "book.pdf", pages, front=4)
    printed = f"page {NEEDLE_PAGE - 4} (PDF page {NEEDLE_PAGE})"
    window = make_window(settings())
    window.open_path(str(pdf))
    wait_open(qtbot, window)
    ask(qtbot, window, QUESTION)
    message = window.library.messages(window.library.find(str(pdf.resolve())).id)[-1]
    assert message.sources and message.sources[0].label == f"page {NEEDLE_PAGE}", message.sources
    assert message.sources[0].shown == printed  # kept with the answer: its history names it so, unopened
    assert f"Attended: {printed}" in window.chat.toPlainText(), window.chat.toPlainText()[-600:]
    cursor = window.chat.textCursor()
    cursor.setPosition(anchors(window.chat)[f"cite:{quote(message.sources[0].label)}#{message.id}"] + 1)
    qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
    pane = window.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=5_000)
    assert pane.page == NEEDLE_PAGE and printed in pane.title.text(), pane.title.text()
    if "attended most (on" in pane.note.text():  # the pages of the passages, as printed too
        assert printed in pane.note.text() and f"on page {NEEDLE_PAGE}," not in pane.note.text() + ",", pane.note.text()
    footer = window.chat.toPlainText()
    assert f"read page {NEEDLE_PAGE} " not in footer and f"read page {NEEDLE_PAGE}," not in footer, footer[-400:]


def test_the_chat_names_cited_attended_and_quoted_pages_as_printed():
    from app.chat import attended_line, sources_line
    from engine.answer import Source

    shown = {"page 4": "page 1 (PDF page 4)", "page 3": "page iii (PDF page 3)"}
    cited = sources_line("Nine hundred [page 4] and [p. 3].", {"page 3", "page 4"}, 7, None, shown)
    assert ">page 1 (PDF page 4)</a>" in cited and ">page iii (PDF page 3)</a>" in cited
    assert "cite:page%204#7" in cited  # the link still names the physical page
    attended = attended_line([Source("page 4", 0.6, page=4)], 7, shown)
    assert ">page 1 (PDF page 4)</a> (60 %)" in attended and "cite:page%204#7" in attended


def test_the_footer_s_read_pages_and_the_source_pane_s_passages_name_pages_as_printed():
    """A fresh tester's trial: the answer footer said "read page 14 …; page 67, page 68 (chapter
    5)" in PDF numbers while the Cited line said "page 48 (PDF page 68)"."""
    from app.chat import footer_text, read_spans
    from engine.library import MessageRecord

    shown = {"page 68": "page 48 (PDF page 68)", "page 14": "page xiv (PDF page 14)"}
    assert read_spans(["page 14", "page 67", "page 68 (characters 0–900)"], ["contents", "chapter 5", "chapter 5"], shown) == (
        "page xiv (PDF page 14) (contents); page 67, page 48 (PDF page 68) (characters 0–900) (chapter 5)")
    assert read_spans(["page 68"], [], shown) == "page 48 (PDF page 68)"  # stored before reasons were
    message = MessageRecord(1, 1, "assistant", "x", "done", 0.0, source="local", model="SmolLM2",
                            recall_json=json.dumps({"tokens_per_head": 10, "spans": ["page 68"], "reasons": ["chapter 5"]}))
    assert "read page 48 (PDF page 68) (chapter 5)" in footer_text(message, shown)
    assert "read page 68 (chapter 5)" in footer_text(message)


def test_a_history_shown_before_its_document_is_open_names_pages_as_printed(qtbot):
    """The trial: a document's earlier answers, shown before it was opened again, said "page 68"
    (the labels come from the open document); the answer's sources keep their printed names."""
    from app.chat import ChatView
    from engine.answer import Source
    from engine.library import MessageRecord
    from engine.workspace import sources_json

    chat = ChatView()
    qtbot.addWidget(chat)
    assert chat.shown == {}  # no document open: no labels to look up
    message = MessageRecord(2, 1, "assistant", "Nine hundred [page 68].", "done", 0.0, source="local", model="SmolLM2",
                            sources_json=sources_json([Source("page 68", 0.7, page=68, shown="page 48 (PDF page 68)")]))
    chat.show_messages([MessageRecord(1, 1, "user", "How many?", "done", 0.0), message])
    text = chat.toPlainText()
    assert "Attended: page 48 (PDF page 68) (70 %)" in text and "Cited: page 48 (PDF page 68)" in text, text
