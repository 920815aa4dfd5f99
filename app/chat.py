"""The chat view: questions, answers rendered as Markdown (code blocks included) while they stream,
citations as links, and a footer per answer saying where it came from and what it cost.

The model is told to cite "[page 12]" or "[src/app.py]"; `link_citations` turns those into
`cite:` links (never inside code), and `sources_line` lists them, marking any label the document
does not have. Clicking a citation emits `citation_clicked(label)`.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QColor, QDesktopServices, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QTextBrowser

from app.library import MessageRecord

CITATION = re.compile(r"\[([^\[\]\n]{1,160})\](?!\()")
_CODE = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]*`)", re.S)
RENDER_EVERY_MS = 50


def looks_like_citation(label: str) -> bool:
    """"page 12", "pages 3-4", "p. 7", "src/app.py", "README.md" — not "[x]" or "[1]"."""
    label = label.strip()
    return bool(re.fullmatch(r"(pages?|p\.)\s*\d+([\s,–-]+\d+)*", label, re.I)) or bool(
        re.fullmatch(r"[\w.\-/ ]*[\w\-]\.[A-Za-z0-9]{1,10}|[\w.\-]+(/[\w.\-]+)+", label)
    )


def citations(text: str) -> list[str]:
    """Citation labels in `text`, in order of first appearance, outside code."""
    found: list[str] = []
    for part in _CODE.split(text):
        if part.startswith("`"):
            continue
        for match in CITATION.finditer(part):
            label = match.group(1).strip()
            if looks_like_citation(label) and label not in found:
                found.append(label)
    return found


def link_citations(text: str) -> str:
    """Markdown with each citation turned into a `cite:` link (code spans and blocks untouched)."""
    def link(match: re.Match) -> str:
        label = match.group(1).strip()
        return f"[[{label}]](cite:{quote(label)})" if looks_like_citation(label) else match.group(0)

    return "".join(part if part.startswith("`") else CITATION.sub(link, part) for part in _CODE.split(text))


def sources_line(text: str, labels: set[str] | None) -> str:
    """HTML: 'Sources: page 1 · src/app.py' (links), unknown labels marked; '' when none."""
    cited = citations(text)
    if not cited:
        return ""
    parts = []
    for label in cited:
        if labels is not None and label not in labels and normalise_label(label) not in labels:
            parts.append(f"<span style='color:#B03030'>{_html(label)} (not in the document)</span>")
        else:
            parts.append(f"<a href='cite:{quote(label)}'>{_html(label)}</a>")
    return "Sources: " + " · ".join(parts)


def footer_text(message: MessageRecord) -> str:
    """'local · TTFT 0.30 s · 3.2 tokens/s · prefix cache hit · 12 tokens' (cloud: endpoint, model, reason)."""
    parts: list[str] = []
    if message.source == "cloud":
        parts.append(f"cloud · {message.endpoint or '?'} · model {message.model or '?'}")
        if message.reason:
            parts.append(f"reason: {message.reason}")
    else:
        parts.append("local" + (f" · {message.model}" if message.model else ""))
    if message.ttft_s is not None:
        parts.append(f"TTFT {message.ttft_s:.2f} s")
    if message.tokens_per_s is not None:
        parts.append(f"{message.tokens_per_s:.1f} tokens/s")
    if message.source != "cloud" and message.prefix_hit is not None:
        parts.append("prefix cache hit" if message.prefix_hit else "prefix cache miss (document prefilled)")
    if message.tokens is not None:
        parts.append(f"{message.tokens} tokens")
    if message.state == "cancelled" or message.stop_reason == "cancelled":
        parts.append("cancelled")
    elif message.state == "interrupted":
        parts.append("interrupted (the app was closed)")
    elif message.stop_reason == "max_tokens":
        parts.append("cut at the answer length limit")
    elif message.stop_reason == "cut":
        parts.append("incomplete: the stream broke off")
    elif message.state == "error":
        parts.append("failed")
    return " · ".join(parts)


class ChatView(QTextBrowser):
    """Read-only conversation. Streaming: `begin_answer()`, `append_text(piece)`..., `finish_answer(msg)`."""

    citation_clicked = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        self.document().setDocumentMargin(14)
        self.labels: set[str] | None = None      # citation labels of the open document
        self.live_text = ""
        self._live_from: int | None = None
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_EVERY_MS)
        self._render_timer.timeout.connect(self._render_live)
        self.renders = 0

    # -------------------------------------------------------------- history
    def show_messages(self, messages: list[MessageRecord]) -> None:
        self._render_timer.stop()
        self._live_from = None
        self.clear()
        for message in messages:
            if message.role == "user":
                self.add_question(message.text, scroll=False)
            else:
                self._header("Halaman · cloud" if message.source == "cloud" else "Halaman", "#6B3FA0")
                self._markdown(message.text or "_(no answer)_")
                self._footer(message)
        self._scroll_to_end()

    def add_question(self, text: str, *, scroll: bool = True) -> None:
        self._header("You", "#2F5D8A")
        cursor = self._end_cursor()
        fmt = QTextCharFormat()
        cursor.insertText(text, fmt)
        self._new_block(cursor)
        if scroll:
            self._scroll_to_end()

    # ------------------------------------------------------------ streaming
    def begin_answer(self, title: str = "Halaman") -> None:
        self._header(title, "#6B3FA0")
        self.live_text = ""
        self._live_from = self._end_cursor().position()
        self._render_live()

    def append_text(self, piece: str) -> None:
        self.live_text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def finish_answer(self, message: MessageRecord) -> None:
        self._render_timer.stop()
        self.live_text = message.text
        self._render_live(final=True)
        self._live_from = None
        self._footer(message)
        self._scroll_to_end()

    @property
    def streaming(self) -> bool:
        return self._live_from is not None

    def _render_live(self, final: bool = False) -> None:
        if self._live_from is None:
            return
        cursor = self._end_cursor()
        cursor.setPosition(self._live_from, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        text = self.live_text if self.live_text or final else "…"
        self._markdown(text if final or not self.live_text else self.live_text + " ▍")
        self.renders += 1
        self._scroll_to_end()

    # -------------------------------------------------------------- pieces
    def _header(self, who: str, color: str) -> None:
        cursor = self._end_cursor()
        if not self.document().isEmpty():
            self._new_block(cursor)
        block = QTextBlockFormat()
        block.setTopMargin(10)
        cursor.setBlockFormat(block)
        fmt = QTextCharFormat()
        fmt.setFontWeight(700)
        fmt.setForeground(QColor(color))
        cursor.insertText(who, fmt)
        self._new_block(cursor)

    def _markdown(self, text: str) -> None:
        cursor = self._end_cursor()
        start = cursor.position()
        cursor.insertMarkdown(link_citations(text))
        block = self.document().findBlock(start)
        code_format = None
        while block.isValid():
            if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
                code_format = code_format or _code_block_format()
                c = QTextCursor(block)
                c.mergeBlockFormat(code_format)
            block = block.next()
        self._new_block(self._end_cursor())

    def _footer(self, message: MessageRecord) -> None:
        cursor = self._end_cursor()
        block = QTextBlockFormat()
        block.setTopMargin(4)
        cursor.setBlockFormat(block)
        lines = [footer_text(message)]
        sources = sources_line(message.text, self.labels)
        if sources:
            lines.insert(0, sources)
        cursor.insertHtml("<span style='color:#777; font-size:small'>" + "<br>".join(lines) + "</span>")
        self._new_block(cursor)

    def _new_block(self, cursor: QTextCursor) -> None:
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == "cite":
            self.citation_clicked.emit(unquote(url.toString()[len("cite:"):]))
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)


def _code_block_format() -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setBackground(QColor("#F3F1F7"))
    fmt.setLeftMargin(6)
    fmt.setRightMargin(6)
    return fmt


def normalise_label(label: str) -> str:
    """'p. 7' / 'pages 7' -> 'page 7'; other labels stripped."""
    m = re.fullmatch(r"(?:pages?|p\.)\s*(\d+)", label.strip(), re.I)
    return f"page {m.group(1)}" if m else label.strip()


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["ChatView", "citations", "link_citations", "sources_line", "footer_text", "looks_like_citation", "normalise_label"]
