"""Issue 44, item 3: one time estimate: the header gives the background read's time left as the
progress line does ("about 15 min" in the header beside "1 h 37 min left" before)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import re  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from app.document_header import whole_read_text  # noqa: E402
from app.notices import ProgressPanel  # noqa: E402
from engine.kvcache.cache import MemoryBreakdown  # noqa: E402
from engine.read_time import ReadPlan  # noqa: E402
from engine.open_document import OpenReport  # noqa: E402
from engine.progress import Phase, Progress  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)

DURATION = re.compile(r"(\d+ h \d+ min|\d+ min \d+ s|\d+ s)")


def unread_report() -> OpenReport:
    report = OpenReport(title="book.pdf", kind="pdf", document_tokens=129_000, prefix_hit=False,
                        position_mode="original", seconds=2.0, prefill_seconds=0.0, prefill_tokens_per_s=0.0,
                        kv=MemoryBreakdown(), full_fp16_bytes=0, unread=True)
    report.read_plan = ReadPlan(tokens=129_000, tokens_per_s=143.0, seconds=900.0, measured=True)  # "about 15 min"
    return report


def test_the_header_gives_the_time_left_the_progress_line_gives(qtbot):
    report = unread_report()
    assert "about 15 min 00 s on this computer" in whole_read_text(report)  # before the read has measured itself
    event = Progress(Phase.PREFILL, 12_000, 129_000, "tokens", tokens_per_s=20.0, eta_s=5_820.0)  # 1 h 37 min
    panel = ProgressPanel()
    qtbot.addWidget(panel)
    panel.show_event(event)
    line = _panel_text(panel)
    header = whole_read_text(report, event.eta_s)
    assert DURATION.search(line.split("tokens/s")[-1]).group(1) == DURATION.search(header).group(1) == "1 h 37 min"
    assert "15 min" not in header


def _panel_text(panel: ProgressPanel) -> str:
    from PySide6.QtWidgets import QLabel

    return " ".join(label.text() for label in panel.findChildren(QLabel))


def _reading_in_the_background(qtbot, tmp_path):
    """A window whose open document (notes.txt, opened index first) is being read whole in the
    background: (window, its BackgroundRead) before any progress event."""
    import threading

    from app import operations as ops
    from app.changes import Changes
    from engine.documents import load_document
    from window_driver import notes_and_other

    window, notes_id, _other = notes_and_other(qtbot, tmp_path)
    path = str(tmp_path / "notes.txt")
    job = ops.open_document(path, name="notes.txt")
    window.state.reading(path, window.library.document(notes_id), job)
    window.state.opened(job, notes_id, path, unread_report(), load_document(path))
    window.state.show(window.library.document(notes_id))
    window.changed.emit(Changes(shown=True))
    read = window.background_read
    read.path, read.job = path, ops.read_document(pause=threading.Event())
    return window, read


def test_the_windows_header_follows_the_background_reads_progress(qtbot, home, tmp_path):
    """The window: the open document read whole in the background; a progress event with its time
    left puts that time in the header, the same as the progress line."""
    window, read = _reading_in_the_background(qtbot, tmp_path)
    assert "about 15 min 00 s on this computer" in window.header.info.text()
    read.show_progress(read.job, Progress(Phase.PREFILL, 12_000, 129_000, "tokens", tokens_per_s=20.0, eta_s=5_820.0))
    assert "about 1 h 37 min left" in window.header.info.text() and "15 min" not in window.header.info.text()
    assert "1 h 37 min left" in _panel_text(window.progress)


def test_the_header_the_progress_line_and_the_library_row_count_down_together(qtbot, home, tmp_path):
    """Issue 44's trial: the header said "about 12 min 19 s" while the progress line, counting down
    between two progress events, said another time. Both (and the library row) show one value:
    after the countdown has ticked, the three give the same duration at the same moment."""
    window, read = _reading_in_the_background(qtbot, tmp_path)
    read.show_progress(read.job, Progress(Phase.PREFILL, 12_000, 129_000, "tokens", tokens_per_s=20.0, eta_s=740.0))
    window.progress.timer.start()
    qtbot.wait(2600)  # the countdown ticks (every 500 ms): 740 s becomes 737 or 738 s
    line = _panel_text(window.progress).split("tokens/s")[-1]
    shown = DURATION.search(line).group(1)
    assert shown != "12 min 20 s"  # it counted down
    assert f"about {shown} left" in window.header.info.text()
    row = window.library_panel.list.item(0).text() + window.library_panel.list.item(1).text()
    assert f"about {shown} left" in row
