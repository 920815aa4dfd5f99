"""A failed open leaves the open document as it was (issue 44): opening a corrupt or refused file
after a good one reads the new file before anything closes the old one, so the first document stays
open in the engine and in the window, its chat kept, and the next question is answered from it;
the failure is one line naming the file."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from engine.documents import DocumentError  # noqa: E402
from engine.session import DocumentSession  # noqa: E402
from test_app import ask, home, make_window, wait_open  # noqa: E402,F401  (fixtures)
from test_app_source_pane import book_pdf  # noqa: E402
from test_session import SMALL  # noqa: E402
from test_span_recall import COMBINATION, QUESTION, settings  # noqa: E402


def broken_pdf(folder):
    """A file named .pdf whose bytes are cut off after the header: PDFium cannot parse it."""
    path = folder / "broken.pdf"
    path.write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" + b"\x00" * 64)
    return path


def test_a_session_keeps_its_document_and_conversation_when_the_next_file_cannot_be_read(smol, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting is on Tuesday at 10 in room 4. Bring the budget report.\n" * 3)
    session = DocumentSession(smol, SMALL)
    session.open(str(notes))
    first = session.ask("When is the meeting?")
    with pytest.raises(DocumentError, match="broken.pdf"):
        session.open(str(broken_pdf(tmp_path)))
    assert session.document is not None and session.document.source == str(notes)
    assert session.conversation is not None  # the conversation a follow-up continues is kept too
    again = session.ask("When is the meeting?")
    assert again.token_ids == first.token_ids


def test_opening_a_corrupt_file_leaves_the_open_document_open_and_its_chat(make_window, qtbot, tmp_path):
    pdf = book_pdf(tmp_path)
    window = make_window(settings())
    window.open_path(str(pdf))
    wait_open(qtbot, window)
    ask(qtbot, window, QUESTION)
    first_id = window.state.open_id
    chat_before = window.chat.toPlainText()
    assert COMBINATION in chat_before

    window.open_path(str(broken_pdf(tmp_path)))
    qtbot.waitUntil(lambda: window.state.opening is None and window.banner.isVisible(), timeout=60_000)
    message = window.banner.text
    assert "broken.pdf" in message and "\n" not in message, message
    assert window.state.open_id == first_id and window.state.current.id == first_id
    assert window.state.document is not None and window.state.document.source == str(pdf.resolve())
    assert window.chat.toPlainText() == chat_before  # the chat is the first document's, as it was
    assert window.conversation.question.isEnabled()

    ask(qtbot, window, QUESTION)  # answered from the first document, without opening it again
    record = window.library.find(str(pdf.resolve()))
    answers = [m for m in window.library.messages(record.id) if m.role == "assistant"]
    assert len(answers) == 2 and answers[-1].state == "done" and COMBINATION in answers[-1].text, answers[-1]
    assert window.library.find(str((tmp_path / "broken.pdf").resolve())) is None
