"""The window shows text it did not write as that text (B20, B21 in docs/REAL_WORLD_INPUTS.md).

A document's title, a file's name, a warning and a model's answer may be written as markup. Qt
would render such a string as rich text and read the images it names from disk (a device, a named
pipe). Each test names the image as a named pipe that says whether anything opened it (`Probe`):
the real window, the real readers and the real worker show the strings, and the pipe stays
unopened. The corpus' own inputs (`/dev/zero`, a pipe nothing writes to) run in a child process
under a memory limit and a timeout: tests/test_window_inputs.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

import pypdf  # noqa: E402
from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel  # noqa: E402

from app import dialogs  # noqa: E402
from app.chat import images_as_text  # noqa: E402
from app.open_flow import warning_note  # noqa: E402
from engine.cloud import CloudPlan  # noqa: E402
from engine.documents import load_document  # noqa: E402
from engine.library import Library  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import Probe, add_document, hover, notes_and_other, pick, stream_answer, window_without_model  # noqa: E402


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A named pipe `probe` in the current folder (where Qt looks for an image named without a folder)."""
    monkeypatch.chdir(tmp_path)
    pipe = Probe(tmp_path / "probe")
    yield pipe
    pipe.close()


def titled_pdf(corpus: Path, path: Path, title: str) -> Path:
    """B20's control PDF saved at `path` with `title` as its document-information title."""
    writer = pypdf.PdfWriter(clone_from=next((corpus / "bugs").glob("B20-*")) / "title-plain.pdf")
    writer.add_metadata({"/Title": title})
    writer.write(path)
    return path


def test_b20_a_title_and_a_file_name_written_as_markup_are_shown_as_their_characters(qtbot, home, corpus, tmp_path,
                                                                                     probe):
    title = f'<img src="{probe.path}">'
    pdf = titled_pdf(corpus, tmp_path / '<img src="probe"> report.pdf', title)
    document = load_document(pdf)
    assert document.title == title
    window = window_without_model(qtbot)
    document_id = add_document(window, pdf, document)

    pick(window, document_id)
    window.grab()
    assert not probe.opened, "the header"
    assert window.header.title.text() == title and window.header.title.textFormat() == Qt.TextFormat.PlainText
    tip = hover(window, document_id)
    assert not probe.opened, "the library row's tooltip"
    assert "&lt;img src=&quot;" in tip and str(pdf).replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;") in tip

    window.open_source_pane()
    window.source_pane.show_segment(document, 0, [])
    window.grab()
    assert not probe.opened, "the source pane's title"
    assert "&lt;img src=&quot;probe&quot;&gt; report.pdf" in window.source_pane.title.text()

    window.banner.show_message("warning", warning_note([f"{title}: a warning that quotes the title"]))
    window.grab()
    assert not probe.opened, "the banner"

    window.open_path(str(pdf))  # fails where the model loads: the name is shown while reading, then in the banner
    window.grab()
    qtbot.waitUntil(lambda: window.banner.kind == "error" and window.banner.isVisible(), timeout=30_000)
    window.grab()
    assert not probe.opened, "the banner after a failed open"
    assert window.banner.text == f'Could not open {pdf.name}: no model in this test'

    box = dialogs.confirm_long_read(window, pdf.name, "about 1 h", folder=False, answer=lambda _choice: None)
    box.grab()
    box.done(0)
    assert not probe.opened, "the long-read question"
    assert pdf.name in box.text()


def test_every_label_of_the_window_says_whether_it_shows_plain_or_rich_text(qtbot, home):
    """Qt guesses for a label left to `AutoText`, and guesses rich text for a string that starts
    like a tag. Each label of the window is plain text, or rich text the window writes itself."""
    window = window_without_model(qtbot)
    guessing = [label.objectName() or label.text() for label in window.findChildren(QLabel)
                if label.textFormat() == Qt.TextFormat.AutoText]
    assert guessing == []


def test_images_in_markdown_become_text_that_names_them():
    assert images_as_text("Here is the chart: ![chart](/dev/zero)") == r"Here is the chart: \[image not shown: chart\]"
    assert images_as_text('![](a.png "title") and ![ x ](file:///x)') == r"\[image not shown\] and \[image not shown: x\]"
    assert images_as_text("![x][ref]\n\n[ref]: /dev/zero") == "!\\[x][ref]\n\n[ref]: /dev/zero", "a reference is a link"
    assert images_as_text("![a [b] c](/dev/zero)") == "!\\[a [b] c](/dev/zero)"
    code = "Write `![x](y.png)` or\n```\n![z](/dev/zero)\n```"
    assert images_as_text(code) == code
    assert images_as_text("No image [page 2], ![half") == "No image [page 2], !\\[half"


def test_b21_images_an_answer_names_are_never_opened_streamed_or_reopened(qtbot, home, tmp_path, probe):
    window, document_id, other_id = notes_and_other(qtbot, tmp_path)
    answers = {
        f"Here is the chart: ![chart]({probe.path})": "Here is the chart: [image not shown: chart]",
        "Relative: ![x](probe)": "Relative: [image not shown: x]",
        f"As a file URL: ![y](file://{probe.path})": "As a file URL: [image not shown: y]",
        f'In HTML: <img src="{probe.path}"> and <img src="probe">': f'In HTML: <img src="{probe.path}"> and <img src="probe">',
        "By reference: ![z][chart]\n\n[chart]: probe": "By reference: ![z]chart",
    }
    for answer, shown in answers.items():
        stream_answer(qtbot, window, document_id, "Show the chart", answer)
        window.grab()
        assert not probe.opened, answer
        assert shown in window.chat.toPlainText()
    pick(window, other_id)
    pick(window, document_id)
    window.grab()
    assert not probe.opened, "the saved conversation shown again"
    assert all(shown in window.chat.toPlainText() for shown in answers.values())
    window.close()

    again = window_without_model(qtbot, library=Library())
    pick(again, document_id)
    again.grab()
    assert not probe.opened, "the saved conversation in a new window"
    assert all(shown in again.chat.toPlainText() for shown in answers.values())
    again.close()


def test_dialogs_quote_titles_names_and_questions_as_typed(qtbot, home, probe):
    """The cloud question quotes the question, the title and the plan's warnings; the password
    prompt names the file."""
    window = window_without_model(qtbot)
    plan = CloudPlan(endpoint="https://example.invalid/v1", model="m", question=f'What is <img src="{probe.path}">?',
                     document_title='<img src="probe">', document_tokens_total=1, document_tokens_sent=1,
                     segments_sent=["page 1"], was_cut=False, warnings=['<img src="probe"> is long'], messages=[])
    box = dialogs.confirm_cloud(window, plan, lambda _send: None)
    box.grab()
    box.done(0)
    assert not probe.opened, "the cloud question"
    assert box.text().startswith('Send this question and part of “<img src="probe">”')
    # Shown as typed: the box is plain text, its informative line too (escaped markup showed as "&lt;").
    informative = box.findChild(QLabel, "qt_msgbox_informativelabel")
    assert informative.textFormat() == Qt.TextFormat.PlainText
    assert f'Question: What is <img src="{probe.path}">?' in informative.text() and "&lt;" not in informative.text()

    prompts = []

    def answer_the_prompt() -> None:
        dialog = QApplication.activeModalWidget()
        dialog.grab()
        prompts.append(dialog.labelText())
        dialog.reject()

    QTimer.singleShot(0, answer_the_prompt)
    assert dialogs.ask_password(window, '<img src="probe">.pdf', wrong=False) is None
    assert not probe.opened, "the password prompt"
    assert prompts == ["<p>&lt;img src=&quot;probe&quot;&gt;.pdf is protected by a password:</p>"]


# ------------------------------------------------------------------------- issue 32
def test_urls_an_answer_writes_are_plain_text_and_clicking_them_opens_nothing(qtbot, home, tmp_path, monkeypatch):
    """Item 2: an answer is untrusted; a URL it makes, as a Markdown link, an autolink or bare, is
    shown as its characters (a link's address after its words), never as a link; citations stay
    links; a click on the text, or on any link but a citation, opens nothing."""
    from PySide6.QtCore import QEvent, QUrl
    from PySide6.QtGui import QDesktopServices, QHelpEvent
    from PySide6.QtWidgets import QToolTip

    from app.untrusted import literal_rich_text

    from test_app import anchors

    opened: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda url: opened.append(url.toString()) or True))
    window, document_id, _other = notes_and_other(qtbot, tmp_path)
    answer = ("See [the **docs**](https://evil.example/x \"<img src='probe'>\"), https://evil.example/y, <http://evil.example/z>, "
              "www.evil.example and [file](file:///etc/passwd) [page 1] [page 1](cite:page%201 \"<b>bold</b>\").")
    stream_answer(qtbot, window, document_id, "Where is it?", answer)
    shown = window.chat.toPlainText()
    for address in ("the docs (https://evil.example/x)", "https://evil.example/y", "http://evil.example/z",
                    "www.evil.example", "file (file:///etc/passwd)"):
        assert address in shown, (address, shown)
    links = anchors(window.chat)
    assert links and all(href.startswith("cite:") for href in links), links
    clicked: list[str] = []
    window.chat.citation_clicked.connect(lambda label, _id: clicked.append(label))
    cursor = window.chat.textCursor()
    for address in ("https://evil.example/y", "the docs"):
        cursor.setPosition(shown.index(address) + 2)
        qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
        assert window.chat.tooltip_at(window.chat.cursorRect(cursor).center()) == "", "a link's title is the model's"
    window.chat.anchorClicked.emit(QUrl("https://evil.example/emitted"))  # a link the view might still hold
    assert opened == [] and clicked == []
    # A citation link keeps the title the model gave it, shown as its characters.
    cursor.setPosition(anchors(window.chat)["cite:page%201"] + 1)
    point = window.chat.cursorRect(cursor).center()
    QApplication.sendEvent(window.chat.viewport(), QHelpEvent(QEvent.Type.ToolTip, point,
                                                               window.chat.viewport().mapToGlobal(point)))
    assert QToolTip.text() == literal_rich_text("<b>bold</b>"), QToolTip.text()
    window.close()


def test_the_chat_escapes_with_the_one_escape_of_app_untrusted():
    """Item 3: `app.chat` quotes labels and footers with `app.untrusted.escape`, not a copy of its own."""
    import app.chat
    from app.untrusted import escape

    assert not hasattr(app.chat, "_html")
    assert app.chat.escape is escape
    from engine.answer import Source

    assert "&lt;b&gt;x.py&lt;/b&gt;" in app.chat.attended_line([Source("<b>x.py</b>", 0.5)])
