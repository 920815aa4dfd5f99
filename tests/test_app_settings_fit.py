"""Issue 44's trial, Settings on a small screen: the model list's "★ recommended" mark was cut
("★ recommende…"), and the dialog must fit the screen's free area (scrolling inside it). On an
800x600 screen: Qt's offscreen platform given that screen (its JSON configuration), in a child
process, since the test process's platform is set once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported (pytest-qt's app): no display needed
pytest.importorskip("PySide6")

PROBE = r"""
import json, os, pathlib, sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.model_list import COLUMNS, RECOMMENDED
from app.settings_dialog import SettingsDialog
from engine.settings import EngineSettings
dialog = SettingsDialog(EngineSettings(), settings_file=pathlib.Path(sys.argv[1]))
dialog.show()
app.processEvents()
table = dialog.model_list.table
metrics = table.fontMetrics()
cells = []
for row in range(table.rowCount()):
    for column in range(table.columnCount()):
        text = table.item(row, column).text()
        lines = text.split("\n")
        cells.append({"text": text, "need_w": max(metrics.horizontalAdvance(line) for line in lines) + 6,
                      "have_w": table.columnWidth(column), "need_h": len(lines) * metrics.height(),
                      "have_h": table.rowHeight(row)})
here = COLUMNS.index("Here")
marked_row = next(row for row in range(table.rowCount()) if RECOMMENDED in table.item(row, here).text())
mark_right = table.columnViewportPosition(here) + metrics.horizontalAdvance(RECOMMENDED)
free = dialog.screen().availableGeometry()
frame = dialog.frameGeometry()
print(json.dumps({"free": [free.width(), free.height()], "frame": [frame.width(), frame.height()],
                  "cells": cells, "recommended": RECOMMENDED, "mark_right": mark_right,
                  "viewport": table.viewport().width()}))
"""


def test_the_settings_dialog_fits_an_800x600_screen_and_cuts_no_model_label(tmp_path):
    screen = tmp_path / "screen.json"
    screen.write_text(json.dumps({"screens": [{"name": "small", "x": 0, "y": 0, "width": 800, "height": 600,
                                               "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    env = {**os.environ, "QT_QPA_PLATFORM": f"offscreen:configfile={screen}", "HALAMAN_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "settings.toml")], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert shown["free"] == [800, 600]
    assert shown["frame"][0] <= shown["free"][0] and shown["frame"][1] <= shown["free"][1], shown["frame"]
    marked = [cell for cell in shown["cells"] if shown["recommended"] in cell["text"]]
    assert len(marked) == 1
    for cell in shown["cells"]:  # every cell's text whole: as wide and as tall as its column and row
        assert cell["need_w"] <= cell["have_w"] and cell["need_h"] <= cell["have_h"], cell
    # and in view without scrolling sideways: at the table's right end it was off screen
    assert shown["mark_right"] <= shown["viewport"], (shown["mark_right"], shown["viewport"])


def test_no_jargon_outside_advanced_in_the_settings_dialog(qtbot, tmp_path):
    """The trial: "prefill peak", "full FP16 cache", "Escalation threshold", "mean log-probability
    per token" and "KV / token" were in view with Advanced closed."""
    from PySide6.QtWidgets import QAbstractButton, QGroupBox, QLabel

    from app.settings_dialog import SettingsDialog
    from engine.settings import EngineSettings

    dialog = SettingsDialog(EngineSettings(), settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    dialog.show()
    table = dialog.model_list.table
    texts = [w.text() for kind in (QLabel, QAbstractButton) for w in dialog.findChildren(kind) if w.isVisible()]
    texts += [w.title() for w in dialog.findChildren(QGroupBox) if w.isVisible()]
    texts += [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    shown = "\n".join(texts)
    for term in ("prefill peak", "FP16", "Escalation", "log-probability", "KV / token"):
        assert term not in shown, term

