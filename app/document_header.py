"""The header above the chat: the document's title, one line about it (size, tokens, KV cache or
its estimate, prefix-cache status) and an Open button when it is not the open one.

Intent out: `open_clicked()`. State in: `show_document(title, info, can_open, tooltip)`, `set_info(text)`.
The info line speaks of reading and memory; the technical terms are in its tooltip (`info_tooltip`).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.units import fmt_duration
from app.untrusted import plain_label
from engine.library import CACHED, MISSING, NOT_CACHED, STALE, DocumentRecord
from engine.open_document import OpenReport
from engine.units import format_bytes, size_ratio


STATUS_WORDS = {CACHED: "its saved reading is ready", STALE: "its saved reading is out of date: it will be read again",
                NOT_CACHED: "it will be read when opened",
                MISSING: "its file is no longer where it was (moved, renamed or deleted): remove it or open it from its new place"}


def document_info(record: DocumentRecord, report: OpenReport | None, *, estimate: str, not_open_status: str | None,
                  whole_read_stopped: bool = False, whole_read_left_s: float | None = None) -> str:
    """"12 pages · 5,231 tokens · kept in 1.2 MiB of memory (48.0× smaller than uncompressed) · read just now",
    in plain words (the KV cache is "memory", a prefix-cache hit "its saved reading").

    `report`: the open report when this document is the open one (else None: `estimate`, the KV
    estimate for its tokens, is shown instead). `not_open_status`: its prefix-cache status when it
    is neither open nor being opened (`engine.library`'s CACHED, STALE, NOT_CACHED), else None.
    `whole_read_stopped`: the background read of the open document, not read whole, was cancelled
    or failed. `whole_read_left_s`: the time that read has left as its progress measures it (the
    progress line's figure), once measured."""
    parts = [record.size_text]
    if record.tokens:
        parts.append(f"{record.tokens:,} tokens")
    if report is not None and report.unread and whole_read_stopped:
        parts.append("not read whole (its read was stopped): each answer re-reads the parts it chooses; "
                     "opening it again reads it")
    elif report is not None and report.unread:
        parts.append(whole_read_text(report, whole_read_left_s))
    elif report is not None:
        parts.append(f"kept in {format_bytes(report.kv.total_bytes)} of memory "
                     f"({size_ratio(report.full_fp16_bytes, report.kv.total_bytes)} than uncompressed)")
        parts.append("its saved reading reused" if report.prefix_hit else "read just now")
    elif record.tokens:
        parts.append(estimate)
    if not_open_status is not None:
        parts.append(f"not open: {STATUS_WORDS.get(not_open_status, not_open_status)}")
    return " · ".join(p for p in parts if p)


def whole_read_text(report: OpenReport, left_s: float | None = None) -> str:
    """What the header says of a document opened index first, not read whole yet: how long its
    whole read will take here, that questions can be asked now and that the read can be cancelled.
    The time is the read's measured time left (`left_s`, the progress line's figure) once there
    is one, before that the plan's (`report.read_plan`): the header said "about 15 min" while the
    progress line said "1 h 37 min left"."""
    if left_s is not None:
        took = f", about {fmt_duration(left_s)} left"
    elif report.read_plan is not None:
        took = f", about {fmt_duration(report.read_plan.seconds)} on this computer"
    else:
        took = ""
    if report.read_from:  # an earlier read's chunks were kept (engine.read_checkpoint)
        took = f", going on from {report.read_from / report.document_tokens:.0%} where it stopped{took}"
    return (f"being read whole in the background{took}: ask now, each answer re-reads the parts it chooses "
            "meanwhile; Cancel (Esc) stops the read")


def info_tooltip(report: OpenReport | None) -> str:
    """The technical words behind the info line, for whoever wants them: the KV cache against a full
    FP16 one, the prefix cache, the position mode."""
    if report is None:
        return ""
    return (f"KV cache {format_bytes(report.kv.total_bytes)} vs {format_bytes(report.full_fp16_bytes)} full FP16; "
            f"prefix cache {'hit' if report.prefix_hit else 'miss (prefilled)'}; positions {report.position_mode}")


class DocumentHeader(QWidget):
    """Title, info line and Open button."""

    open_clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("docHeader")
        self.title = plain_label("No document open")
        self.title.setObjectName("docTitle")
        self.info = plain_label()
        self.info.setObjectName("docInfo")
        self.info.setWordWrap(True)
        self.open_button = QPushButton("Open")
        self.open_button.setToolTip("Read this document (a saved prefix cache skips the prefill)")
        self.open_button.clicked.connect(self.open_clicked)
        self.open_button.hide()
        titles = QVBoxLayout()
        titles.addWidget(self.title)
        titles.addWidget(self.info)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 8)
        layout.addLayout(titles, 1)
        layout.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignTop)

    def show_document(self, title: str, info: str, *, can_open: bool, tooltip: str = "") -> None:
        self.title.setText(title)
        self.info.setText(info)
        self.info.setToolTip(tooltip)
        self.open_button.setVisible(can_open)

    def show_nothing(self) -> None:
        self.show_document("No document open", "", can_open=False)

    def set_info(self, text: str) -> None:
        self.info.setText(text)
