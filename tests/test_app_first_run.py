"""The first hour in the window (issue 32, item 2): the built-in model is said, once and plainly, to
be a small demo, with the way to the model list (what fits this machine, and its download); every
answer's footer names the model that wrote it, and an answer the model was unsure of says so (the
confidence the cloud escalation uses: mean log-probability against its threshold)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from app.model_list import COLUMNS  # noqa: E402
from engine.documents import load_document  # noqa: E402
from engine.models.catalog import load_catalog  # noqa: E402
from engine.models.download import COMPLETE_MARKER, model_folder  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402
from test_app import ask, home, make_window, pick, text_doc, wait_open  # noqa: E402,F401  (fixtures)
from window_driver import add_document, stream_answer, window_without_model  # noqa: E402


def test_the_built_in_model_is_said_once_to_be_a_small_demo_with_the_model_list_offered(make_window, qtbot):
    window = make_window()
    qtbot.waitUntil(window.banner.isVisible, timeout=10_000)
    assert "built-in model, a small demo" in window.banner.text and "bigger model" in window.banner.text
    assert window.banner.kind == "info" and window.banner.action.text() == "Choose a model…"
    qtbot.mouseClick(window.banner.action, Qt.MouseButton.LeftButton)
    dialog = window.settings_flow.dialog
    qtbot.waitUntil(lambda: dialog is not None and dialog.isVisible(), timeout=5_000)
    table = dialog.model_list.table
    fits = COLUMNS.index("Fits")
    assert table.rowCount() == len(load_catalog()) > 1
    assert all(table.item(row, fits).text() for row in range(table.rowCount())), "each says whether it fits here"
    dialog.reject()
    window.close()

    again = make_window()  # said once: not at the next start; the status bar still says what the model is
    assert not again.banner.isVisible() and "a small demo model" in again.model_status.text()


def test_the_demo_notice_is_for_the_built_in_model_alone(home):
    from app.first_run import demo_model_only

    models = load_catalog()
    assert demo_model_only(EngineSettings(), models)
    assert not demo_model_only(EngineSettings(model="Qwen/Qwen2.5-1.5B-Instruct"), models)
    other = next(model for model in models if not model.embedded)
    folder = model_folder(other.repo)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMPLETE_MARKER).write_text("{}")
    assert not demo_model_only(EngineSettings(), models), "a bigger model is downloaded: no need to say it"


def test_an_answer_the_model_was_unsure_of_says_so_under_it(qtbot, home, tmp_path):
    from app.chat import LOW_CONFIDENCE

    window = window_without_model(qtbot)
    path = text_doc(tmp_path)
    document_id = add_document(window, path, load_document(path))
    pick(window, document_id)
    threshold = window.settings.cloud.escalation_threshold
    stream_answer(qtbot, window, document_id, "When is the meeting?", "On Tuesday.", mean_logprob=threshold + 0.5)
    stream_answer(qtbot, window, document_id, "Where is it?", "In room 9.", mean_logprob=threshold - 0.5)
    sure, unsure = [m for m in window.library.messages(document_id) if m.role == "assistant"]
    assert (sure.low_confidence, unsure.low_confidence) == (0, 1)
    assert abs(unsure.mean_logprob - (threshold - 0.5)) < 1e-9
    footers = [line for line in window.chat.toPlainText().splitlines() if line.startswith("answered here")]
    assert len(footers) == 2 and LOW_CONFIDENCE not in footers[0] and LOW_CONFIDENCE in footers[1]
    window.close()
    again = window_without_model(qtbot)  # from the history, after a restart
    pick(again, document_id)
    assert LOW_CONFIDENCE in again.chat.toPlainText().strip().splitlines()[-1]
    again.close()
