"""The desktop app, offscreen, on the real default model, real corpus PDFs and real SQLite files.

Every window gets its own HALAMAN_HOME (library, chat history, settings, prefix caches) under
tmp_path and the session's already loaded model (`smol`) through the worker's model factory; the
real load path is covered once, through the `halaman` entry point, in test_app_entry.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.gauge import AMBER_AT, RED_AT, level_for  # noqa: E402
from app.window import MainWindow  # noqa: E402
from engine.kvcache.cache import MemoryBreakdown  # noqa: E402
from engine.library import CACHED, STALE, Library  # noqa: E402
from engine.memory import MemoryReport  # noqa: E402
from engine.settings import CachePolicy, EngineSettings, load_settings, save_settings, settings_path  # noqa: E402

SMALL = EngineSettings(
    cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64, chunk_tokens=256),
    max_new_tokens=12,
)
OPEN_TIMEOUT_MS = 240_000   # a few hundred tokens of prefill on two busy CPU cores
ANSWER_TIMEOUT_MS = 180_000


@pytest.fixture
def home(tmp_path, monkeypatch, memory_keyring):
    """An isolated HALAMAN_HOME with small, fast settings saved in it."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    save_settings(SMALL)
    return tmp_path / "home"


@pytest.fixture
def make_window(qtbot, smol, home):
    """Open a real window on the shared model; every window is closed (thread stopped) afterwards."""
    windows: list[MainWindow] = []

    def make(settings: EngineSettings | None = None, wait_model: bool = True) -> MainWindow:
        if settings is not None:
            save_settings(settings)
        window = MainWindow(model_factory=lambda _settings: smol)
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        if wait_model:
            qtbot.waitUntil(lambda: window.client.model is not None and not window.client.busy, timeout=60_000)
        return window

    yield make
    for window in windows:
        window.close()
        assert not window.client.thread.isRunning()


def drop(window: MainWindow, path: Path) -> QDropEvent:
    """What the OS delivers when a file or folder is dragged onto the window."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    enter = QDragEnterEvent(QPoint(200, 200), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    event = QDropEvent(QPointF(200, 200), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, event)
    return event


def wait_open(qtbot, window: MainWindow, timeout: int = OPEN_TIMEOUT_MS, *, read: bool = True) -> None:
    """Wait until the opened document can be asked about; with `read`, also until its whole read
    (index first: in the background) has ended and saved its reading."""
    qtbot.waitUntil(lambda: window.state.open_id is not None and window.state.opening is None, timeout=timeout)
    if read:
        qtbot.waitUntil(lambda: not window.background_read.running and not window.client.busy, timeout=timeout)


def ask(qtbot, window: MainWindow, question: str, *, wait: bool = True) -> list[str]:
    """Type a question, press Ask; returns the list the streamed pieces are appended to."""
    pieces: list[str] = []
    original = window.answers.on_text

    def spy(piece: str) -> None:
        pieces.append(piece)
        original(piece)

    window.answers.on_text = spy
    assert window.conversation.question.isEnabled()
    window.conversation.question.setText(question)
    qtbot.mouseClick(window.conversation.ask_button, Qt.MouseButton.LeftButton)
    assert window.state.live is not None
    if wait:
        qtbot.waitUntil(lambda: window.state.live is None, timeout=ANSWER_TIMEOUT_MS)
    return pieces


def text_doc(tmp_path: Path, name: str = "notes.txt") -> Path:
    path = tmp_path / name
    path.write_text("The meeting is on Tuesday at 10 in room 4. Bring the budget report.\n", encoding="utf-8")
    return path


def streaming_answer(make_window, qtbot, tmp_path, question: str, *, pieces: int) -> tuple[MainWindow, list[str]]:
    """A window with the notes open, answering `question` (up to 400 tokens), once `pieces` pieces
    have streamed; returns it and the list the pieces keep arriving in."""
    window = make_window(SMALL.replace(max_new_tokens=400))
    window.open_path(str(text_doc(tmp_path)))
    wait_open(qtbot, window)
    streamed = ask(qtbot, window, question, wait=False)
    qtbot.waitUntil(lambda: len(streamed) >= pieces, timeout=ANSWER_TIMEOUT_MS)
    return window, streamed


def pick(window: MainWindow, document_id: int) -> None:
    """Click a document in the library list (as a user would: the panel emits `selected`)."""
    from app.library_panel import ID_ROLE

    items = [window.library_panel.list.item(row) for row in range(window.library_panel.list.count())]
    window.library_panel.list.setCurrentItem(next(item for item in items if item.data(ID_ROLE) == document_id))


# --------------------------------------------------------------------------------------- tests
def test_drop_a_pdf_then_ask_streams_an_answer_with_a_footer(make_window, qtbot, corpus):
    window = make_window()
    # the status bar says how the weights are held (float32 on a CPU for the embedded model)
    assert "(float32)" in window.model_status.text() and "4-bit" not in window.model_status.text()
    pdf = corpus / "pdf" / "P01_minimal-document.pdf"
    assert drop(window, pdf).isAccepted()
    assert window.state.opening == str(pdf.resolve())
    assert not window.conversation.ask_button.isEnabled()  # no questions while the document is read
    wait_open(qtbot, window)

    record = window.library.find(str(pdf.resolve()))
    assert record is not None and record.kind == "pdf" and record.pages == 1 and record.tokens > 100
    assert window.library.status(record, window.cache_status, window.settings) == CACHED
    # The key the library recorded (DocumentSession.prefix_key) is the one open() saved under.
    assert [entry.key for entry in window.client.workspace.prefix_store().entries()] == [record.prefix_key]
    assert "page 1" in window.state.segments
    item_text = window.library_panel.list.currentItem().text()
    assert "P01" in item_text or record.title in item_text
    assert "1 page" in item_text and "cached" in item_text

    pieces = ask(qtbot, window, "What is the first word of the document?")
    assert len(pieces) >= 2  # streamed, not delivered at once
    messages = window.library.messages(record.id)
    assert [m.role for m in messages] == ["user", "assistant"]
    answer = messages[-1]
    assert answer.state == "done" and answer.text.strip() and answer.text == "".join(pieces)
    assert answer.source == "local" and answer.ttft_s > 0 and answer.tokens >= 2 and answer.prefix_hit == 0
    shown = window.chat.toPlainText()
    assert "What is the first word" in shown
    assert answer.text.strip()[:10] in shown
    footer = shown.strip().splitlines()[-1]
    assert footer.startswith(f"answered here by {window.client.model.label} · first words after "), footer
    for expected in ("tokens/s", "document read for this answer"):
        assert expected in footer, footer
    assert "TTFT" not in footer and "prefix cache" not in footer and "prefilled" not in footer
    info = window.header.info.text()
    assert "read just now" in info and "prefilled" not in info and "positions" not in info and "FP16" not in info
    assert window.conversation.question.isEnabled()
    # A citation shows the cited page of the document in the source pane.
    window.chat.citation_clicked.emit("page 1", None)
    assert window.source_pane.isVisible() and window.source_pane.page == 1
    assert not window.source_pane.page_label.pixmap().isNull()
    window.source_pane.close_button.click()
    assert not window.source_pane.isVisible()


def test_a_folder_drop_ingests_a_small_code_tree(make_window, qtbot, tmp_path):
    repo = tmp_path / "tinyrepo"
    (repo / "src").mkdir(parents=True)
    (repo / "build").mkdir()
    (repo / "src" / "app.py").write_text("def main():\n    return parse_config('halaman.toml')\n")
    (repo / "src" / "config.py").write_text("def parse_config(path):\n    return open(path).read()\n")
    (repo / "README.md").write_text("# Tiny\nA tiny repository.\n")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "build" / "generated.py").write_text("IGNORED = True\n")

    window = make_window()
    assert drop(window, repo).isAccepted()
    wait_open(qtbot, window)
    record = window.library.find(str(repo.resolve()))
    assert record.kind == "repo" and record.files == 4
    assert set(window.state.segments) == {".gitignore", "README.md", "src/app.py", "src/config.py"}  # build/ is ignored
    assert "4 files" in window.library_panel.list.currentItem().text()
    assert "ignored by .gitignore: build/" in window.banner.text  # what was left out is said, not hidden
    assert window.conversation.question.isEnabled()


def test_settings_round_trip_through_the_file_and_the_dialog(make_window, qtbot, memory_keyring):
    window = make_window()
    window.show_settings()
    dialog = window.settings_flow.dialog
    assert dialog is not None and dialog.isVisible()
    assert dialog.cache.budget.value() == 512 and dialog.cache.window_tokens.value() == 128
    before = dialog.cache.budget_info.text()
    assert "MiB" in before or "KiB" in before
    dialog.cache.budget.setValue(1024)
    assert dialog.cache.budget_info.text() != before  # the MB it implies, live
    dialog.cache.window_tokens.setValue(256)
    dialog.cache.sink.setValue(8)
    dialog.cache.kv_bits.setCurrentIndex(dialog.cache.kv_bits.findData(8))
    dialog.model.max_new_tokens.setValue(20)
    dialog.cloud.setChecked(True)
    dialog.cloud.url.setText("http://127.0.0.1:9/v1")
    dialog.cloud.model.setText("tiny-cloud")
    dialog.cloud.key.setText("sk-secret-123")
    dialog.cloud.threshold.setValue(-2.25)
    dialog.cloud.auto.setChecked(True)
    assert dialog.error.text() == ""
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert not dialog.isVisible()

    saved = load_settings()
    assert saved.cache.budget_tokens == 1024 and saved.cache.window_tokens == 256 and saved.cache.sink_tokens == 8
    assert saved.cache.kv_bits == 8 and saved.max_new_tokens == 20
    assert saved.cloud.enabled and saved.cloud.base_url == "http://127.0.0.1:9/v1" and saved.cloud.model == "tiny-cloud"
    assert saved.cloud.escalation_threshold == -2.25 and saved.cloud.auto_escalate
    assert "sk-secret-123" not in settings_path().read_text()
    assert "sk-secret-123" in memory_keyring.passwords.values()
    assert window.settings == saved
    qtbot.waitUntil(lambda: window.client.workspace.settings == saved, timeout=10_000)  # applied, no restart

    window.show_settings()
    again = window.settings_flow.dialog
    assert again.cache.budget.value() == 1024 and again.cache.window_tokens.value() == 256 and again.cache.sink.value() == 8
    assert again.cache.kv_bits.currentData() == 8 and again.cloud.isChecked()
    assert again.cloud.model.text() == "tiny-cloud" and again.cloud.key.text() == ""
    assert "A key is stored" in again.cloud.key_state.text()
    again.reject()


def test_invalid_settings_are_refused_with_a_message(make_window, qtbot):
    window = make_window()
    before = settings_path().read_text()
    window.show_settings()
    dialog = window.settings_flow.dialog
    dialog.cache.budget.setValue(100)  # smaller than sink 4 + window 128
    assert "smaller than sink + window" in dialog.error.text()
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.isVisible()  # refused
    assert "smaller than sink + window" in dialog.error.text()
    assert settings_path().read_text() == before
    dialog.cache.budget.setValue(512)
    dialog.cache.residual.setValue(200)  # more than the window
    assert "residual" in dialog.error.text()
    dialog.reject()
    assert window.settings == SMALL


def test_the_gauge_shows_the_engines_memory_report(make_window, qtbot, tmp_path):
    window = make_window()
    window.open_path(str(text_doc(tmp_path)))
    wait_open(qtbot, window)
    qtbot.waitUntil(lambda: not window.client.busy, timeout=30_000)
    engine_report = window.client.workspace.session.memory()  # the worker is idle: safe to call here
    qtbot.waitUntil(lambda: window.gauge.report is not None and window.gauge.report.kv.total_bytes > 0, timeout=5_000)
    shown = window.gauge.report
    assert shown.weights_bytes == engine_report.weights_bytes == window.client.workspace.model.weight_bytes
    assert shown.kv == engine_report.kv and shown.kv_bytes > 0
    assert shown.budget_bytes == engine_report.budget_bytes > shown.kv_bytes
    assert shown.device == engine_report.device and shown.device_total_bytes == engine_report.device_total_bytes
    tip = window.gauge.toolTip()
    for value in (engine_report.weights_bytes, engine_report.kv.total_bytes, engine_report.kv.codes_bytes,
                  engine_report.kv.quant_meta_bytes, engine_report.kv.residual_bytes, engine_report.budget_bytes):
        assert f"{value:,} bytes" in tip
    # Colours by how full the device is.
    def at(used: float) -> MemoryReport:
        total = 1000
        return MemoryReport("test", 100, MemoryBreakdown(codes_bytes=10), 10, total, int(total * (1 - used)), 50)
    assert level_for(at(0.5)) == "ok"
    assert level_for(at(AMBER_AT + 0.01)) == "amber"
    assert level_for(at(RED_AT + 0.01)) == "red"
    window.gauge.set_report(at(RED_AT + 0.01))
    assert window.gauge.level == "red" and "almost out of memory" in window.gauge.used.text()


def test_the_event_loop_keeps_turning_during_a_prefill_and_cancel_stops_it(make_window, qtbot, tmp_path):
    long = tmp_path / "long.txt"
    long.write_text("The quick brown fox jumps over the lazy dog near the river bank. " * 400, encoding="utf-8")
    # Recall off: the read comes before any question (index first needs span recall to answer
    # from pages), the read this test watches. tests/test_app_index_first.py has the other kind.
    window = make_window(SMALL.replace(recall=SMALL.recall.replace(recall_tokens=0)))
    window.open_path(str(text_doc(tmp_path)))  # a document already in the library, open
    wait_open(qtbot, window)
    ask(qtbot, window, "When is the meeting?")
    ticks = []
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start()
    window.open_path(str(long))
    qtbot.waitUntil(lambda: window.progress.label.text().startswith("Reading the document:"), timeout=60_000)
    assert window.progress.isVisible() and "tokens/s" in window.progress.label.text()
    assert " left" in window.progress.label.text() and "Prefill" not in window.progress.label.text()
    assert window.progress.bar.maximum() > 3000  # tokens done / total
    assert not window.conversation.ask_button.isEnabled() and "Reading the document" in window.conversation.question.placeholderText()
    assert "memory once read: ≈ " in window.header.info.text()  # the estimate before the cache is built
    # the library lists it from the moment reading starts, with how far the prefill got
    reading = window.library_panel.list.item(0).text()
    assert reading.startswith("long.txt\n") and re.search(r"reading \d+ %", reading), reading
    qtbot.wait(1500)  # more progress events: the row is updated, and the window stays on long.txt
    assert re.search(r"reading \d+ %", window.library_panel.list.currentItem().text())
    assert window.header.title.text() == "long.txt" and window.state.current is None
    assert "When is the meeting?" not in window.chat.toPlainText()  # not the other document's chat
    started, gauge_before = time.monotonic(), window.gauge.updates
    count_before = len(ticks)
    qtbot.wait(2000)
    elapsed = time.monotonic() - started
    assert window.state.opening is not None  # still prefilling
    assert len(ticks) - count_before >= 0.5 * elapsed / 0.020, "the GUI thread stalled during the prefill"
    assert window.gauge.updates - gauge_before >= 2 * elapsed - 1, "the gauge must update at least twice a second"

    cancel_at = time.monotonic()
    qtbot.mouseClick(window.progress.cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.state.opening != str(long.resolve()), timeout=5_000)
    assert time.monotonic() - cancel_at < 1.0
    # The notes, which the long read had replaced, are open again, from their saved reading (issue
    # 32, item 6: a cancelled second read left no document open at all).
    wait_open(qtbot, window)
    qtbot.waitUntil(lambda: not window.client.busy, timeout=30_000)
    assert window.header.title.text() == "notes.txt" and window.state.report.prefix_hit
    assert window.conversation.question.isEnabled()
    assert not window.banner.isVisible()  # cancelling is not an error
    # the notes are still listed as they were, and the reading row is gone
    rows = [window.library_panel.list.item(r).text() for r in range(window.library_panel.list.count())]
    assert len(rows) == 1 and rows[0].startswith("notes.txt\n") and "reading" not in rows[0]
    timer.stop()


def test_cancel_stops_an_answer_within_a_second(make_window, qtbot, tmp_path):
    window, _pieces = streaming_answer(make_window, qtbot, tmp_path, "Write a long story about the meeting.", pieces=3)
    # the answer's decode speed and the time left until max_new_tokens (400) at that speed
    shown = re.search(r"Answering… (\d+) tokens so far · ([\d.,]+) tokens/s · at most (.+) left",
                      window.progress.label.text())
    assert shown, window.progress.label.text()
    assert int(shown[1]) >= 3 and float(shown[2].replace(",", "")) > 0
    message_id = window.state.live.message_id
    cancel_at = time.monotonic()
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: window.state.live is None, timeout=5_000)
    assert time.monotonic() - cancel_at < 1.0
    saved = window.library.message(message_id)
    assert saved.state == "cancelled" and saved.text.strip() and saved.stop_reason == "cancelled"
    assert "cancelled" in window.chat.toPlainText().splitlines()[-1]
    assert window.conversation.question.isEnabled()


def test_history_survives_closing_and_reopening_the_window(make_window, qtbot, tmp_path):
    doc = text_doc(tmp_path)
    first = make_window()
    first.open_path(str(doc))
    wait_open(qtbot, first)
    ask(qtbot, first, "When is the meeting?")
    answer = first.library.messages(first.state.open_id)[-1].text
    assert answer.strip()
    first.close()
    assert not first.client.thread.isRunning()

    second = make_window()
    record = second.library.find(str(doc.resolve()))
    assert record is not None
    pick(second, record.id)
    shown = second.chat.toPlainText()
    assert "When is the meeting?" in shown and answer.strip()[:12] in shown
    assert second.library_status(record.id) == CACHED and "cached" in second.library_panel.list.currentItem().text()
    assert second.header.open_button.isVisible() and not second.conversation.question.isEnabled()
    # Opening it again restores the prefix cache instead of prefilling.
    qtbot.mouseClick(second.header.open_button, Qt.MouseButton.LeftButton)
    wait_open(qtbot, second)
    assert second.state.report.prefix_hit and second.state.report.prefill_seconds == 0
    assert "its saved reading reused" in second.header.info.text() and "prefix" not in second.header.info.text()
    assert "prefix cache hit" in second.header.info.toolTip()  # the technical words, for whoever wants them


def test_closing_during_an_answer_stops_cleanly_and_keeps_the_history(make_window, qtbot, tmp_path, home):
    window, pieces = streaming_answer(make_window, qtbot, tmp_path, "Tell me everything about the meeting, in detail.", pieces=3)
    doc_id = window.state.open_id
    began = time.monotonic()
    window.close()
    assert time.monotonic() - began < 5
    assert not window.client.thread.isRunning()
    library = Library(home / "data" / "library.sqlite")
    messages = library.messages(doc_id)
    library.close()
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].text.startswith("Tell me everything")
    assert messages[1].state in ("cancelled", "interrupted")
    assert messages[1].text.startswith("".join(pieces[:3]).strip()[:5]) and len(messages[1].text) >= len("".join(pieces[:3]))


def test_a_broken_pdf_shows_an_error_and_the_app_keeps_working(make_window, qtbot, corpus):
    window = make_window()
    broken = corpus / "pdf" / "synthetic" / "synthetic-truncated.pdf"
    drop(window, broken)
    qtbot.waitUntil(lambda: window.banner.isVisible() and window.state.opening is None, timeout=60_000)
    message = window.banner.text
    assert "synthetic-truncated.pdf" in message and "incomplete" in message
    assert "Traceback" not in message and window.banner.kind == "error"
    assert window.state.open_id is None and not window.conversation.question.isEnabled()

    drop(window, corpus / "pdf" / "P01_minimal-document.pdf")
    assert not window.banner.isVisible()
    wait_open(qtbot, window)
    assert window.conversation.question.isEnabled() and "page 1" in window.state.segments


def test_a_password_protected_pdf_prompts_and_retries(make_window, qtbot, corpus):
    window = make_window()
    prompts: list[bool] = []
    answers = iter(["not-it", "openpassword"])

    def fake_prompt(name: str, wrong: bool) -> str | None:
        prompts.append(wrong)
        return next(answers)

    window.reader.ask_password = fake_prompt
    drop(window, corpus / "pdf" / "P02_libreoffice-writer-password.pdf")
    wait_open(qtbot, window)
    assert prompts == [False, True]  # asked, then told the first password was wrong
    assert "Lorem ipsum" in window.state.segments["page 1"]


def test_unexpected_errors_go_to_a_dialog_and_the_log(make_window, qtbot, monkeypatch):
    import sys
    import threading

    from app import errors

    window = make_window()
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    reporter = errors.install_error_hooks(window)
    try:
        raise ValueError("boom from a slot")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    qtbot.waitUntil(lambda: bool(reporter.shown), timeout=2_000)
    assert reporter.shown == ["ValueError: boom from a slot"]
    assert reporter.dialogs[-1].isVisible()
    assert "boom from a slot" in errors.log_path().read_text()
    reporter.dialogs[-1].close()
    from PySide6.QtCore import qInstallMessageHandler

    qInstallMessageHandler(reporter.previous_qt_handler)


def _cloud_settings(base_url: str, **cloud) -> EngineSettings:
    return SMALL.replace(cloud=SMALL.cloud.replace(enabled=True, base_url=base_url, model="ok", **cloud))


def test_ask_the_cloud_shows_what_is_sent_and_streams_the_answer_with_its_provenance(make_window, qtbot, tmp_path):
    from cloud_server import PIECES, CloudServer

    with CloudServer() as server:
        window = make_window(_cloud_settings(server.base_url, ask_before_sending=True))
        window.open_path(str(text_doc(tmp_path)))
        wait_open(qtbot, window)
        assert window.conversation.cloud_button.isVisible() and window.conversation.cloud_button.isEnabled()

        # Declined: nothing is sent, the question stays in the history as not sent.
        window.conversation.question.setText("When is the meeting?")
        qtbot.mouseClick(window.conversation.cloud_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.confirm_box is not None and window.confirm_box.isVisible(), timeout=30_000)
        assert "When is the meeting?" in window.confirm_box.informativeText()
        assert server.base_url.split("//")[1].split("/")[0] in window.confirm_box.text()
        next(b for b in window.confirm_box.buttons() if b.text() == "Don't send").click()
        qtbot.waitUntil(lambda: window.state.live is None, timeout=10_000)
        assert server.requests == []
        doc_id = window.state.open_id
        assert window.library.messages(doc_id)[-1].state == "cancelled"

        # Accepted: streamed, with endpoint, model and reason in the footer.
        pieces = []
        original = window.answers.on_text
        window.answers.on_text = lambda piece: (pieces.append(piece), original(piece))
        window.conversation.question.setText("When is the meeting?")
        qtbot.mouseClick(window.conversation.cloud_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.confirm_box.isVisible(), timeout=30_000)
        send = next(b for b in window.confirm_box.buttons() if b.text() == "Send")
        send.click()
        qtbot.waitUntil(lambda: window.state.live is None, timeout=30_000)
        assert len(server.requests) == 1 and pieces == PIECES
        answer = window.library.messages(doc_id)[-1]
        assert answer.source == "cloud" and answer.text == "".join(PIECES) and answer.state == "done"
        # The model the endpoint says it used (the test server answers requests for "ok" as "served-model").
        assert answer.model == "served-model" and answer.reason == "user asked" and answer.endpoint
        footer = window.chat.toPlainText().strip().splitlines()[-1]
        assert footer.startswith(f"answered by the cloud: model served-model at {answer.endpoint}") and "why: user asked" in footer


def test_a_low_confidence_local_answer_escalates_to_the_cloud_by_itself(make_window, qtbot, tmp_path):
    from cloud_server import PIECES, CloudServer

    with CloudServer() as server:
        settings = _cloud_settings(server.base_url, ask_before_sending=False, auto_escalate=True, escalation_threshold=0.0)
        window = make_window(settings)
        outcomes = []  # what the worker returned for each answer: decided in the workspace, not here
        window.answers.ended.connect(lambda live, outcome, error: outcomes.append(outcome))
        window.open_path(str(text_doc(tmp_path)))
        wait_open(qtbot, window)
        ask(qtbot, window, "When is the meeting?")
        doc_id = window.state.open_id
        qtbot.waitUntil(lambda: len(window.library.messages(doc_id)) == 3 and window.state.live is None, timeout=60_000)
        roles = [(m.role, m.source) for m in window.library.messages(doc_id)]
        assert roles == [("user", None), ("assistant", "local"), ("assistant", "cloud")]  # the question is not repeated
        cloud = window.library.messages(doc_id)[-1]
        assert cloud.text == "".join(PIECES) and cloud.reason.startswith("low confidence")
        assert len(server.requests) == 1
        local_outcome, cloud_outcome = outcomes
        assert local_outcome.escalation == cloud.reason and cloud_outcome.escalation is None
        for message, outcome in zip(window.library.messages(doc_id)[1:], outcomes, strict=True):
            stored = {name: getattr(message, name) for name in outcome.record.fields()}
            assert stored == outcome.record.fields()  # the library row is the workspace's record


def test_out_of_memory_offers_to_lower_the_budget_and_retry(make_window, qtbot, tmp_path, monkeypatch):
    """Memory runs out inside the engine's open (where its boundary turns what is raised into a
    HalamanError), as a real prefill does, not above it."""
    import torch

    from engine.reading import Reader

    real_encode = Reader.encode_document
    calls = []

    def encode_once_out_of_memory(self, document):
        calls.append(self.settings.cache.budget_tokens)
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_encode(self, document)

    monkeypatch.setattr(Reader, "encode_document", encode_once_out_of_memory)
    window = make_window()
    window.open_path(str(text_doc(tmp_path)))
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=30_000)
    assert "Out of GPU memory" in window.banner.text and "Traceback" not in window.banner.text
    assert window.banner.action.isVisible() and "Lower the budget" in window.banner.action.text()
    qtbot.mouseClick(window.banner.action, Qt.MouseButton.LeftButton)
    wait_open(qtbot, window)
    assert calls == [512, 256]
    assert load_settings().cache.budget_tokens == 256 and window.settings.cache.budget_tokens == 256


def test_a_cache_policy_change_reopens_the_document_and_only_its_prefix_cache_misses(make_window, qtbot, tmp_path):
    window = make_window()
    doc = text_doc(tmp_path)
    window.open_path(str(doc))
    wait_open(qtbot, window)
    assert not window.state.report.prefix_hit
    record_id = window.state.open_id

    bigger = window.settings.replace(cache=window.settings.cache.replace(budget_tokens=640))
    save_settings(bigger)
    window.apply_settings(bigger)  # what the dialog's Save does
    assert window.state.opening == str(doc.resolve()) and not window.conversation.ask_button.isEnabled()
    wait_open(qtbot, window)
    qtbot.waitUntil(lambda: not window.client.busy, timeout=30_000)
    assert window.client.workspace.settings.cache.budget_tokens == 640  # no restart
    assert window.state.open_id == record_id and not window.state.report.prefix_hit  # new policy: a miss

    window.apply_settings(SMALL)  # back: the first policy's cache is still on disk
    assert window.state.opening is not None
    wait_open(qtbot, window)
    assert window.state.report.prefix_hit

    # The recall budget is read at each question: the document stays open, questions stay allowed.
    fewer = SMALL.replace(recall=SMALL.recall.replace(recall_tokens=256))
    window.apply_settings(fewer)
    qtbot.waitUntil(lambda: window.client.workspace.settings == fewer and not window.client.busy, timeout=30_000)
    assert window.state.opening is None and window.state.open_id == record_id and window.conversation.question.isEnabled()
    # The archive's format is written while reading: the workspace says REOPEN_DOCUMENT, the window reopens.
    window.apply_settings(fewer.replace(recall=fewer.recall.replace(archive_bits=2)))
    assert window.state.opening == str(doc.resolve()) and not window.conversation.ask_button.isEnabled()
    wait_open(qtbot, window)
    assert window.state.open_id == record_id


def test_the_library_calls_a_cache_stale_exactly_when_its_prefix_key_would_miss(make_window, qtbot, tmp_path):
    # "auto" positions resolve to "original" for a document that fits: choosing "original" keeps
    # every field of the prefix key, so the saved cache still hits, and the library says cached.
    window = make_window()
    notes, other = text_doc(tmp_path), text_doc(tmp_path, "other.txt")
    window.open_path(str(notes))
    wait_open(qtbot, window)
    notes_id = window.state.open_id
    window.open_path(str(other))
    wait_open(qtbot, window)
    assert window.settings.cache.position_mode == "auto" and window.state.report.position_mode == "original"
    window.apply_settings(SMALL.replace(cache=SMALL.cache.replace(position_mode="original")))
    qtbot.waitUntil(lambda: window.state.ready and not window.client.busy, timeout=OPEN_TIMEOUT_MS)
    assert window.library_status(notes_id) == CACHED
    window.apply_settings(SMALL.replace(cache=SMALL.cache.replace(position_mode="compact")))  # another key
    qtbot.waitUntil(lambda: window.state.ready and not window.client.busy, timeout=OPEN_TIMEOUT_MS)
    assert window.library_status(notes_id) == STALE
    window.apply_settings(SMALL.replace(cache=SMALL.cache.replace(position_mode="original")))
    qtbot.waitUntil(lambda: window.state.ready and not window.client.busy, timeout=OPEN_TIMEOUT_MS)
    window.open_document(notes_id)
    wait_open(qtbot, window)
    assert window.state.report.prefix_hit  # what the library said: cached


def test_the_source_pane_is_remembered_open_or_closed_with_its_width(make_window, qtbot, tmp_path):
    window = make_window()
    window.resize(1600, 800)  # room for the pane to be wider than it must be (436 px here)
    window.open_path(str(text_doc(tmp_path)))
    wait_open(qtbot, window)
    window.chat.citation_clicked.emit(next(iter(window.state.segments)), None)
    assert window.source_pane.isVisible()
    side, chat, pane = window.splitter.sizes()
    window.splitter.setSizes([side, chat + pane - 600, 600])
    qtbot.waitUntil(lambda: window.source_pane.width() == 600, timeout=5_000)
    window.close()

    # A restart: the pane is open again, as wide as it was. (The offscreen screen is narrower than
    # the window: restoring the geometry clamps it, so it is made as wide again first.)
    again = make_window(wait_model=False)
    again.resize(1600, 800)
    qtbot.waitUntil(lambda: again.source_pane.isVisible(), timeout=5_000)
    assert abs(again.source_pane.width() - 600) <= 4, again.splitter.sizes()
    again.source_pane.close_button.click()
    again.close()

    third = make_window()  # closed when the app was: closed; opened again at the width it had
    third.resize(1600, 800)
    assert not third.source_pane.isVisible()
    third.open_path(str(text_doc(tmp_path)))
    wait_open(qtbot, third)
    third.chat.citation_clicked.emit(next(iter(third.state.segments)), None)
    assert third.source_pane.isVisible() and abs(third.source_pane.width() - 600) <= 4, third.splitter.sizes()


def test_a_model_that_cannot_be_loaded_is_a_message_not_a_crash(qtbot, home):
    from engine.errors import ModelError

    def missing(_settings):
        raise ModelError("model not found: /nowhere/model.gguf does not exist; check the path in Settings")

    window = MainWindow(model_factory=missing)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=30_000)
    assert "Could not load the model: model not found" in window.banner.text
    assert window.banner.action.text() == "Settings…" and "Traceback" not in window.banner.text
    assert window.model_status.text() == "No model loaded" and not window.conversation.question.isEnabled()
    window.close()
    assert not window.client.thread.isRunning()


# ------------------------------------------------------------------------------------ recall
# A budget far below the document, so that most of it is only in the archive and an answer has to
# recall it (block 32 divides the 128-token chunk).
RECALL = SMALL.replace(cache=CachePolicy(budget_tokens=128, window_tokens=32, residual_tokens=32, chunk_tokens=128))


def recall_repo(tmp_path: Path) -> Path:
    """Four files of plain lines (not minified), ~500 tokens in all; the code is in src/vault.py."""
    repo = tmp_path / "recallrepo"
    (repo / "src").mkdir(parents=True)
    words = "alpha beta gamma delta river stone cloud apple engine window garden".split()
    for i, name in enumerate(("README.md", "src/core.py", "src/vault.py", "notes.txt")):
        lines = [" ".join(words[(i + j + k) % len(words)] for k in range(9)) for j in range(12)]
        if name == "src/vault.py":
            lines.insert(6, "The secret code of the vault is 58213.")
        (repo / name).write_text("\n".join(lines) + "\n")
    return repo


def anchors(view) -> dict[str, int]:
    """href -> document position of every link in a chat view."""
    found: dict[str, int] = {}
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().isAnchor():
                found[fragment.charFormat().anchorHref()] = fragment.position()
            it += 1
        block = block.next()
    return found


def test_an_answer_lists_the_files_it_attended_to_and_they_survive_a_restart(make_window, qtbot, tmp_path):
    from urllib.parse import quote

    from engine.estimate import estimate
    from engine.units import format_bytes

    repo = recall_repo(tmp_path)
    window = make_window(RECALL)
    assert f"Recall brings back up to {RECALL.recall.recall_tokens:,} tokens per question" in window.memory_panel.budget.text()
    assert drop(window, repo).isAccepted()
    wait_open(qtbot, window)
    record = window.library.find(str(repo.resolve()))
    assert record.tokens > 3 * RECALL.cache.budget_tokens
    # Before a document is read, its estimate says how much disk its archive takes.
    archive = estimate(window.client.model.profile, RECALL.cache, record.tokens, RECALL.recall).archive_bytes
    assert archive > 0 and f"archive on disk: {format_bytes(archive)}" in window.estimate_text(record.tokens)

    ask(qtbot, window, "What is the secret code of the vault?")
    message = window.library.messages(record.id)[-1]
    assert message.sources, "a recalled answer has attention-grounded sources"
    assert all(source.label in window.state.segments and 0 < source.share <= 1 for source in message.sources)
    # span recall (the question shares words with the files) recalls spans, not blocks
    assert message.recall["tokens_per_head"] > 0 and (message.recall["blocks_recalled"] > 0 or message.recall["spans"])
    attended = "Attended: " + " · ".join(f"{s.label} ({s.share * 100:.0f} %)" for s in message.sources)
    lines = window.chat.toPlainText().strip().splitlines()
    assert attended in lines
    footer = lines[-1]
    assert re.search(rf" · recall ([^·]+ · )?{message.recall['tokens_per_head']:,} tokens in [\d,]+ ms( · |$)", footer), footer
    # The gauge shows the tokens recalled for this question, as the engine counts them.
    engine_kv = window.client.workspace.session.memory().kv  # the worker is idle: safe to call here
    qtbot.waitUntil(lambda: window.gauge.report is not None and window.gauge.report.kv.recalled_bytes > 0, timeout=10_000)
    assert window.gauge.report.kv.recalled_bytes == engine_kv.recalled_bytes
    assert f"recalled for this question {format_bytes(engine_kv.recalled_bytes)}" in window.gauge.kv_legend.text()

    # Clicking an attended file shows it, as a citation click does.
    top = message.sources[0].label
    cursor = window.chat.textCursor()
    cursor.setPosition(anchors(window.chat)[f"cite:{quote(top)}#{message.id}"] + 1)
    qtbot.mouseClick(window.chat.viewport(), Qt.MouseButton.LeftButton, pos=window.chat.cursorRect(cursor).center())
    pane = window.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=5_000)
    assert pane.page is None and pane.code.toPlainText() == window.state.segments[top] and top in pane.title.text()
    secret = window.state.segments["src/vault.py"].splitlines().index("The secret code of the vault is 58213.") + 1
    assert top == "src/vault.py" and secret in pane.marked_lines, (pane.marked_lines, message.passages)
    assert pane.code.textCursor().blockNumber() + 1 in pane.marked_lines, "scrolled to the strongest passage"
    assert len(pane.marked_lines) <= 5 < pane.code.blockCount(), "the attended lines, not the whole file"
    window.close()

    second = make_window(RECALL)
    pick(second, record.id)
    lines = second.chat.toPlainText().strip().splitlines()
    assert attended in lines and lines[-1] == footer  # from SQLite, after a restart
    assert "archive on disk:" in second.header.info.text()  # not open: the estimate, archive included


def test_a_document_read_without_an_archive_says_recall_re_reads_its_pages(make_window, qtbot, tmp_path):
    doc = recall_repo(tmp_path)
    first = make_window(RECALL.replace(recall=RECALL.recall.replace(archive=False)))
    first.open_path(str(doc))
    wait_open(qtbot, first)
    assert "recall is off" not in first.banner.text  # off by the settings: nothing to warn about
    first.close()

    # The archive is on again, but the saved prefix cache was made without one: the snapshot is
    # reused, the window says so (the engine's warning), and span recall re-reads the file it
    # chooses from its token ids instead of the archive.
    second = make_window(RECALL)
    second.open_path(str(doc))
    wait_open(qtbot, second)
    assert second.state.report.prefix_hit
    assert second.banner.isVisible() and "re-reads the parts it chooses" in second.banner.text
    assert "it has no archive" in second.banner.text
    ask(qtbot, second, "What is the secret code of the vault?")
    lines = second.chat.toPlainText().strip().splitlines()
    assert " · read src/vault.py (matching words) · recall " in lines[-1] and "recall off" not in lines[-1]
    assert any(line.startswith("Attended:") and "src/vault.py" in line for line in lines)

    # Block recall needs the archive: with it, recall is off for this document.
    third = make_window(RECALL.replace(recall=RECALL.recall.replace(selection="blocks")))
    third.open_path(str(doc))
    wait_open(qtbot, third)
    assert "recall is off for this document: it has no archive" in third.banner.text
    ask(qtbot, third, "What is the secret code of the vault?")
    assert " · recall off (no archive for this document)" in third.chat.toPlainText().strip().splitlines()[-1]


def test_the_file_dialogs_start_in_the_last_folder_and_offer_every_source_type(make_window, qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from app.window import OPEN_FILTER

    folder = tmp_path / "papers"
    folder.mkdir()
    window = make_window()
    seen = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (seen.append(args), ("", ""))[1])
    window.choose_file()
    assert seen[-1][2] == str(Path.home())  # nothing opened yet
    window.open_path(str(text_doc(folder)))
    wait_open(qtbot, window)
    window.close()
    second = make_window()  # a new run remembers it
    second.choose_file()
    assert seen[-1][2] == str(folder.resolve())
    documents = OPEN_FILTER.split(";;")[0]
    for suffix in ("*.pdf", "*.md", "*.py", "*.js", "*.ts", "*.go", "*.rs", "*.c", "*.java", "*.ipynb"):
        assert f" {suffix}" in documents or f"({suffix}" in documents, suffix


def test_a_long_read_says_how_long_first_and_offers_a_subfolder(make_window, qtbot, tmp_path, monkeypatch):
    import engine.read_time
    from PySide6.QtWidgets import QFileDialog

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "README.md").write_text("# Demo\n\nA small project about rivers.\n" * 30, encoding="utf-8")
    (repo / "src" / "main.py").write_text("def river():\n    return 'The river flows north.'\n", encoding="utf-8")
    monkeypatch.setattr(engine.read_time, "LONG_READ_S", 0.0)  # every read counts as long here
    # Recall off: the read comes first, so a long one is asked about (index first reads in the
    # background instead, where Cancel stops it: tests/test_app_index_first.py).
    window = make_window(SMALL.replace(recall=SMALL.recall.replace(recall_tokens=0)))

    # "Don't read": nothing is prefilled, nothing is open, no error
    window.open_path(str(repo))
    qtbot.waitUntil(lambda: window.confirm_box is not None and window.confirm_box.isVisible(), timeout=60_000)
    box = window.confirm_box
    assert "tokens" in box.text() and "on this computer" in box.text()
    assert {b.text() for b in box.buttons()} == {"Read it all", "Choose a subfolder…", "Don't read"}
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Don't read"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.state.opening is None and not window.client.busy, timeout=10_000)
    assert window.state.open_id is None and not window.banner.isVisible()
    assert window.library.find(str(repo.resolve())) is None

    # a question about a read that was replaced is withdrawn; the new read asks under its own name
    window.open_path(str(repo))
    qtbot.waitUntil(lambda: window.confirm_box is not box and window.confirm_box.isVisible(), timeout=60_000)
    stale = window.confirm_box
    window.open_path(str(text_doc(tmp_path)))
    qtbot.waitUntil(lambda: window.confirm_box is not stale and window.confirm_box.isVisible(), timeout=60_000)
    assert not stale.isVisible() and "notes.txt" in window.confirm_box.text()
    box = window.confirm_box
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Don't read"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.state.opening is None and not window.client.busy, timeout=10_000)

    # "Choose a subfolder…": the folder dialog starts in the folder; the subfolder is read instead
    starts = []
    monkeypatch.setattr(QFileDialog, "getExistingDirectory",
                        lambda _parent, _title, start: (starts.append(start), str(repo / "src"))[1])
    window.open_path(str(repo))
    qtbot.waitUntil(lambda: window.confirm_box is not box and window.confirm_box.isVisible(), timeout=60_000)
    box = window.confirm_box
    qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Choose a subfolder…"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.confirm_box is not box and window.confirm_box.isVisible(), timeout=60_000)
    assert starts == [str(repo.resolve())]
    qtbot.mouseClick(next(b for b in window.confirm_box.buttons() if b.text() == "Read it all"), Qt.MouseButton.LeftButton)
    wait_open(qtbot, window)
    record = window.library.document(window.state.open_id)
    assert record.path == str((repo / "src").resolve()) and "river" in window.state.segments["main.py"]


def test_removing_the_document_while_it_answers_stops_cleanly(make_window, qtbot, tmp_path):
    window, _pieces = streaming_answer(make_window, qtbot, tmp_path, "Write a long story about the meeting.", pieces=2)
    doc_id = window.state.open_id
    window.remove_document(doc_id)
    qtbot.waitUntil(lambda: window.state.live is None and not window.client.busy, timeout=10_000)
    assert window.library.document(doc_id) is None and window.library.messages(doc_id) == []
    assert not window.banner.isVisible() and window.library_panel.list.count() == 0
    window.open_path(str(text_doc(tmp_path, "again.txt")))  # and the app goes on
    wait_open(qtbot, window)
    assert ask(qtbot, window, "When is the meeting?")
