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
free = dialog.screen().availableGeometry()
frame = dialog.frameGeometry()
print(json.dumps({"free": [free.width(), free.height()], "frame": [frame.width(), frame.height()],
                  "cells": cells, "recommended": RECOMMENDED}))
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
