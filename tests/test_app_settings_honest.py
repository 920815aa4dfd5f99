"""Issue 44, item 5: the settings dialog says what the settings are and keeps what the user set:
the privacy title follows the saved cloud setting, the mouse wheel does not change a box the
pointer passes over while the dialog scrolls, a refused Save says why where the user looks."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QWheelEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.settings import CloudSettings, EngineSettings, RecallSettings, load_settings  # noqa: E402


def wheel(widget, steps: int) -> None:
    """A real wheel event of `steps` notches (down when negative) over the middle of `widget`."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_the_privacy_title_follows_the_saved_cloud_setting_when_the_dialog_reopens(qtbot, tmp_path, memory_keyring):
    """Saved with the cloud on, reopened: the box is ticked and the title must not say "nothing
    leaves this computer" (it did: a checkable group box starts checked, so loading "on" emitted
    no change and the title stayed "off")."""
    from app.settings_dialog import SettingsDialog

    file = tmp_path / "settings.toml"
    first = SettingsDialog(EngineSettings(), settings_file=file)
    qtbot.addWidget(first)
    assert not first.cloud.isChecked() and "nothing leaves this computer" in first.cloud.title()
    first.cloud.setChecked(True)
    first.cloud.url.setText("http://127.0.0.1:9/v1")
    first.cloud.model.setText("tiny-cloud")
    first.buttons.button(first.buttons.StandardButton.Save).click()
    assert first.saved is not None and load_settings(file).cloud.enabled

    reopened = SettingsDialog(load_settings(file), settings_file=file)
    qtbot.addWidget(reopened)
    assert reopened.cloud.isChecked()
    assert "nothing leaves" not in reopened.cloud.title() and "on:" in reopened.cloud.title()
    reopened.load(EngineSettings())  # and back: the title follows every load
    assert not reopened.cloud.isChecked() and "nothing leaves this computer" in reopened.cloud.title()


def test_the_wheel_changes_a_box_only_after_the_user_clicks_into_it(qtbot, tmp_path, memory_keyring):
    """Scrolling the dialog over Archive bits changed 4 → 2 by accident. A box without the focus
    lets the wheel pass (to the scroll area); once focused it takes it as before."""
    from app.settings_dialog import SettingsDialog

    settings = EngineSettings(recall=RecallSettings(archive_bits=4))
    dialog = SettingsDialog(settings, settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.mouseClick(dialog.cache.advanced_toggle, Qt.MouseButton.LeftButton)
    bits, budget, threshold = dialog.recall.archive_bits, dialog.cache.budget, dialog.cloud.threshold
    before = (bits.currentIndex(), budget.value(), threshold.value())
    for box in (bits, budget, threshold):
        wheel(box, -1)
        wheel(box, 1)
        wheel(box, -2)
    assert (bits.currentIndex(), budget.value(), threshold.value()) == before
    assert dialog.values() == settings

    budget.setFocus()
    qtbot.waitUntil(budget.hasFocus, timeout=2000)
    wheel(budget, 1)
    assert budget.value() == before[1] + budget.singleStep(), "a focused box still takes the wheel"


def test_a_refused_save_says_why_beside_the_save_button_not_below_the_scrolled_part(qtbot, tmp_path, memory_keyring):
    """The error line sat at the bottom of the scrolling content, below the visible part on a
    laptop screen, so Save seemed to do nothing. It is outside the scroll area now, visible, with
    the whole message (word-wrapped, not cut)."""
    from app.settings_dialog import SettingsDialog

    dialog = SettingsDialog(EngineSettings(cloud=CloudSettings()), settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    dialog.resize(800, 500)  # smaller than the content: the dialog scrolls
    dialog.show()
    assert dialog.scroll.verticalScrollBar().maximum() > 0, "the test needs a dialog that scrolls"
    dialog.cloud.setChecked(True)
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.saved is None and "endpoint URL" in dialog.error.text()
    assert not dialog.scroll.widget().isAncestorOf(dialog.error)
    assert dialog.error.isVisible() and dialog.error.wordWrap()
    assert dialog.error.visibleRegion().boundingRect().height() >= dialog.error.fontMetrics().height()


def test_a_change_that_reads_the_open_document_again_says_so_before_save(qtbot, tmp_path, memory_keyring):
    """Issue 44, item 3: saving a new memory budget restarted the open document's read from 0 %
    without a word. The dialog says it before Save; a change that keeps the reading says nothing."""
    from app.settings_dialog import SettingsDialog

    dialog = SettingsDialog(EngineSettings(), settings_file=tmp_path / "settings.toml", open_title="thinkpython2.pdf",
                            document_tokens=129_000)
    qtbot.addWidget(dialog)
    assert dialog.error.text() == ""
    dialog.model.max_new_tokens.setValue(dialog.model.max_new_tokens.value() + 16)  # from the next question on
    assert dialog.error.text() == ""
    dialog.cache.budget.setValue(dialog.cache.budget.value() - 512)
    assert "opens thinkpython2.pdf again" in dialog.error.text() and "starts over" in dialog.error.text()
    assert "C62828" not in dialog.error.styleSheet(), "a note, not an error"
    dialog.cache.budget.setValue(dialog.cache.budget.value() + 512)
    assert dialog.error.text() == ""

    nothing_open = SettingsDialog(EngineSettings(), settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(nothing_open)
    nothing_open.cache.budget.setValue(nothing_open.cache.budget.value() - 512)
    assert nothing_open.error.text() == ""


def test_a_model_path_that_does_not_exist_is_refused_at_save_and_nothing_is_written(qtbot, tmp_path, memory_keyring):
    """A fresh tester saved Model = GGUF file /nonexistent/model.gguf: the dialog closed, the file
    kept it, the model unloaded and the open document closed with a banner blaming the document.
    Now Save says so beside the button and keeps the dialog open."""
    from app.settings_dialog import SettingsDialog

    file = tmp_path / "settings.toml"
    dialog = SettingsDialog(EngineSettings(), settings_file=file)
    qtbot.addWidget(dialog)
    dialog.model.kind.setCurrentIndex(dialog.model.kind.findData("gguf"))
    dialog.model.path.setText(str(tmp_path / "nonexistent" / "model.gguf"))
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.saved is None and not file.exists()
    assert "does not exist" in dialog.error.text() and "model.gguf" in dialog.error.text()

    real = tmp_path / "real.gguf"
    real.write_bytes(b"GGUF")  # the dialog checks that it is there; loading it is the worker's job
    dialog.model.path.setText(str(real))
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.saved is not None and load_settings(file).model == str(real)
