"""The source pane's view of a code or text file: read-only, with syntax colours from Pygments where
it is installed, and a margin that numbers the lines as the file on disk does (`numbers`, from
`engine.documents.lines`: the text as read has runs of blank lines collapsed, so counting its own
lines would put line 127 of the file at 124)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QSyntaxHighlighter, QTextCharFormat
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class CodeColours(QSyntaxHighlighter):
    """Syntax colours from Pygments, when it is installed (it comes with rich and pytest; Halaman
    does not require it), line by line: a string spanning lines is coloured as code after its
    first line, which a viewer for checking sources can afford."""

    def __init__(self, document, lexer) -> None:
        super().__init__(document)
        from pygments.styles import get_style_by_name

        self.lexer, self.style, self.formats = lexer, get_style_by_name("default"), {}

    def _format(self, kind) -> QTextCharFormat | None:
        if kind not in self.formats:
            colour = self.style.style_for_token(kind)["color"]
            fmt = None
            if colour:
                fmt = QTextCharFormat()
                fmt.setForeground(QColor(f"#{colour}"))
            self.formats[kind] = fmt
        return self.formats[kind]

    def highlightBlock(self, text: str) -> None:
        at = 0
        for kind, value in self.lexer.get_tokens(text):
            fmt = self._format(kind)
            if fmt is not None:
                self.setFormat(at, len(value), fmt)
            at += len(value)


def lexer_for(path: str | Path):
    """A Pygments lexer for a file name, None for plain text or without Pygments."""
    try:
        from pygments.lexers import get_lexer_for_filename
        from pygments.util import ClassNotFound
    except ImportError:
        return None
    try:
        lexer = get_lexer_for_filename(str(path), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None
    return None if lexer.name == "Text only" else lexer


PROSE_LEXERS = {"Markdown", "GitHub Flavored Markdown", "reStructuredText", "TeX", "Org Mode"}
"""Lexers of text written as paragraphs, one long line each: wrapped, not scrolled sideways."""
PROSE_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst", ".org", ".tex", ""}


def is_prose(path: str | Path) -> bool:
    """Whether the file at `path` is prose (wrapped at the view's width) rather than code (its
    lines kept): a known prose suffix, a prose markup, or no code lexer for its name."""
    if Path(path).suffix.lower() in PROSE_SUFFIXES:
        return True
    lexer = lexer_for(path)
    return lexer is None or lexer.name in PROSE_LEXERS


class LineNumbers(QWidget):
    """The line-number margin of a `CodeView` (Qt's code editor example)."""

    def __init__(self, view: CodeView) -> None:
        super().__init__(view)
        self.view = view

    def sizeHint(self) -> QSize:
        return QSize(self.view.margin_width(), 0)

    def paintEvent(self, event) -> None:
        self.view.paint_numbers(self, event)


class CodeView(QPlainTextEdit):
    """Read-only text with line numbers in the margin: the file's own (`file_lines`, one per line of
    the text shown) when they are known, else the text's."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.numbers = LineNumbers(self)
        self.file_lines: list[int] | None = None
        self.blockCountChanged.connect(lambda _n: self.setViewportMargins(self.margin_width(), 0, 0, 0))
        self.updateRequest.connect(self._update_numbers)
        self.setViewportMargins(self.margin_width(), 0, 0, 0)

    def show_text(self, text: str, file_lines: list[int] | None, *, wrap: bool = False) -> None:
        """Show `text`; `file_lines`: the file's line number of each of its lines (None: unknown,
        the text's own are shown). `wrap`: prose, wrapped at the view's width (a .docx paragraph
        is one line of the text, and was cut at the right edge); code keeps its lines as written
        and scrolls sideways (the horizontal scroll bar shows when a line is wider than the view)."""
        self.file_lines = file_lines if file_lines is not None and len(file_lines) == text.count("\n") + 1 else None
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth if wrap else QPlainTextEdit.LineWrapMode.NoWrap)
        self.setPlainText(text)
        self.setViewportMargins(self.margin_width(), 0, 0, 0)

    def line_number(self, block: int) -> int:
        """The number the margin shows for line `block` (0-based) of the text."""
        return self.file_lines[block] if self.file_lines is not None and block < len(self.file_lines) else block + 1

    def margin_width(self) -> int:
        last = self.line_number(max(0, self.blockCount() - 1))
        return 12 + self.fontMetrics().horizontalAdvance("9") * len(str(max(1, last)))

    def _update_numbers(self, rect: QRect, dy: int) -> None:
        if dy:
            self.numbers.scroll(0, dy)
        else:
            self.numbers.update(0, rect.y(), self.numbers.width(), rect.height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        area = self.contentsRect()
        self.numbers.setGeometry(QRect(area.left(), area.top(), self.margin_width(), area.height()))

    def paint_numbers(self, widget: QWidget, event) -> None:
        painter = QPainter(widget)
        painter.fillRect(event.rect(), QColor("#f0f0f0"))
        painter.setPen(QColor("#888"))
        block = self.firstVisibleBlock()
        top = round(self.blockBoundingGeometry(block).translated(self.contentOffset()).top())
        height = self.fontMetrics().height()
        while block.isValid() and top <= event.rect().bottom():
            if block.isVisible():
                painter.drawText(0, top, widget.width() - 6, height, Qt.AlignmentFlag.AlignRight,
                                 str(self.line_number(block.blockNumber())))
            top += round(self.blockBoundingRect(block).height())
            block = block.next()
        painter.end()
