"""The header above the chat: the document's title, one line about it (size, tokens, KV cache or
its estimate, prefix-cache status) and an Open button when it is not the open one.

Intent out: `open_clicked()`. State in: `show_document(title, info, can_open)`, `set_info(text)`.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.untrusted import plain_label
from engine.library import DocumentRecord
from engine.session import OpenReport
from engine.units import format_bytes, size_ratio


def document_info(record: DocumentRecord, report: OpenReport | None, *, estimate: str, not_open_status: str | None) -> str:
    """"12 pages · 5,231 tokens · KV cache 1.2 MiB vs 58 MiB full FP16 (48×) · prefilled · …".

    `report`: the open report when this document is the open one (else None: `estimate`, the KV
    estimate for its tokens, is shown instead). `not_open_status`: its prefix-cache status when it
    is neither open nor being opened ("cached", "stale", "not cached"), else None."""
    parts = [record.size_text]
    if record.tokens:
        parts.append(f"{record.tokens:,} tokens")
    if report is not None:
        parts.append(f"KV cache {format_bytes(report.kv.total_bytes)} vs {format_bytes(report.full_fp16_bytes)} full FP16 "
                     f"({size_ratio(report.full_fp16_bytes, report.kv.total_bytes)})")
        parts.append("prefix cache hit" if report.prefix_hit else "prefilled")
        parts.append(f"positions {report.position_mode}")
    elif record.tokens:
        parts.append(estimate)
    if not_open_status is not None:
        parts.append(f"prefix cache: {not_open_status} — not open")
    return " · ".join(p for p in parts if p)


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

    def show_document(self, title: str, info: str, *, can_open: bool) -> None:
        self.title.setText(title)
        self.info.setText(info)
        self.open_button.setVisible(can_open)

    def show_nothing(self) -> None:
        self.show_document("No document open", "", can_open=False)

    def set_info(self, text: str) -> None:
        self.info.setText(text)
