"""Issue 44, what a fresh trial in a real window still found in the chat and the export: a model's
line starting with "#" drawn as a heading (the answer is the model's text: its headings stay the
characters it wrote, and an image it names is shown as text, never fetched: a real HTTP server
counts the requests); a cancelled answer's "first words after 0.00 s"; a .docx answer's caution
saying "check them against the page"; an export suggested in the previous document's folder."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from typing import ClassVar  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import add_document, pick, stream_answer, window_without_model  # noqa: E402

from engine.documents import load_document  # noqa: E402


class Counting(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_GET(self):  # noqa: N802 - the standard library's name
        Counting.requests.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Counting.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def headings(chat) -> list[str]:
    found, block = [], chat.document().firstBlock()
    while block.isValid():
        if block.blockFormat().headingLevel():
            found.append(block.text())
        block = block.next()
    return found


def test_a_model_line_starting_with_a_hash_is_text_and_an_image_is_not_fetched(qtbot, home, tmp_path, server):
    notes = tmp_path / "notes.txt"
    notes.write_text("Revenue rose 12 % in 2024.\n", encoding="utf-8")
    window = window_without_model(qtbot)
    document_id = add_document(window, notes, load_document(notes))
    pick(window, document_id)
    port = server.server_address[1]
    answer = (f"# Title\nbody\n\n## Second\nmore\n\n![x](http://127.0.0.1:1/x.png)\n\n![chart](http://127.0.0.1:{port}/chart.png)\n\n"
              "Summary\n===\n")
    stream_answer(qtbot, window, document_id, "What does it say?", answer)
    qtbot.wait(300)
    shown = window.chat.toPlainText()
    assert headings(window.chat) == [], "no line of the answer is a heading"
    assert "# Title" in shown and "## Second" in shown and "body" in shown
    assert "[image not shown: x]" in shown and "[image not shown: chart]" in shown

    window.chat.show_messages(window.library.messages(document_id))  # the stored answer, shown again
    qtbot.wait(300)
    assert headings(window.chat) == [] and "# Title" in window.chat.toPlainText()
    assert Counting.requests == [], "nothing the answer names is fetched"
    window.close()


def cancelled_before_a_word(qtbot, window, document_id: int, question: str) -> None:
    """Ask `question` and have the worker stop before the model's first word, as a cancel there does
    (`engine.answer.StopReason.CANCELLED`, no text, no token)."""
    from app.worker import Job
    from engine.answer import Answer, StopReason

    window.library.add_message(document_id, "user", question)
    window.chat.add_question(question)
    message_id = window.library.add_message(document_id, "assistant", "", state="streaming", source="local")

    def write(workspace, ctx):
        return workspace.outcome(Answer(question, "", token_ids=[], prompt_tokens=0, time_to_first_token_s=0.0,
                                        decode_tokens_per_s=0.0, prefix_hit=False, stop_reason=StopReason.CANCELLED,
                                        mean_logprob=0.0))

    job = Job("ask", write, title="Answering…")
    window.answers.start(job, document_id=document_id, message_id=message_id, question=question, source="local")
    window.client.submit(job)
    qtbot.waitUntil(lambda: window.state.live is None, timeout=30_000)


def test_a_cancelled_answer_says_it_stopped_before_its_first_word(qtbot, home, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("Revenue rose 12 % in 2024.\n", encoding="utf-8")
    window = window_without_model(qtbot)
    document_id = add_document(window, notes, load_document(notes))
    pick(window, document_id)
    cancelled_before_a_word(qtbot, window, document_id, "How much did revenue rise?")
    footer = window.chat.toPlainText().strip().splitlines()[-1]
    assert "cancelled before the first word" in footer and "first words after" not in footer, footer
    window.close()


def test_a_caution_names_the_unit_its_document_has(qtbot, home, tmp_path):
    """A .docx has no pages: its low-confidence caution said "check them against the page"."""
    import docx
    from pdf_fixtures import helvetica_book

    from engine.attended import AttendedSpan

    path = tmp_path / "minutes.docx"
    report = docx.Document()
    report.add_paragraph("The meeting is on Tuesday in room 9.")
    report.save(path)
    pdf = helvetica_book(tmp_path / "atlas.pdf", [["The meeting is on Tuesday in room 9."]])
    window = window_without_model(qtbot)
    threshold = window.settings.cloud.escalation_threshold
    for source, unit in ((path, "the passage"), (pdf, "the page")):
        document = load_document(source)
        segment = document.segments[0]
        document_id = add_document(window, source, document)
        pick(window, document_id)
        at = segment.text.index("The meeting")
        stream_answer(qtbot, window, document_id, "When is the meeting?", "On Tuesday.", mean_logprob=threshold - 0.5,
                      passages=[AttendedSpan(0, segment.label, segment.page, segment.path, at, at + 20, 0.6)])
        footer = window.chat.toPlainText().strip().splitlines()[-1]
        assert "low confidence" in footer and f"check them against {unit}" in footer, (source.suffix, footer)
    window.close()


def test_export_suggests_the_shown_documents_folder_and_name(qtbot, home, tmp_path, monkeypatch):
    """The trial opened a document from one folder, then exported another's conversation: the
    dialog started in the first document's folder."""
    from PySide6.QtWidgets import QFileDialog

    first_folder, second_folder = tmp_path / "reports", tmp_path / "letters"
    first_folder.mkdir()
    second_folder.mkdir()
    first, second = first_folder / "annual.txt", second_folder / "lease.txt"
    first.write_text("Revenue rose 12 % in 2024.\n", encoding="utf-8")
    second.write_text("The rent is due on the first.\n", encoding="utf-8")
    window = window_without_model(qtbot)
    add_document(window, first, load_document(first))
    window.store.last_folder = str(first_folder)  # the folder of the last document opened
    second_id = add_document(window, second, load_document(second))
    pick(window, second_id)
    asked = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda parent, title, start, filters: asked.append(start) or ("", "")))
    window.action_export.trigger()
    assert asked == [str(second_folder / "lease (conversation).md")]
    window.close()
