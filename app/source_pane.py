"""The source pane: the cited page or file beside the chat, the passages the answer attended to
highlighted (`engine.attended.AttendedSpan`, character ranges in the segment's text).

PDF pages are rendered by PDFium (pypdfium2) at the pane's width; a passage is found in PDFium's
text of the page by its characters without white space (the segment text is the normalised page
text, so offsets differ but the characters do not), and PDFium's rectangles of those characters
are drawn over the page, more opaque for a larger share. Code and text files are shown as the model
read them, with line numbers (and Pygments' colours where it is installed), the attended lines
marked and the strongest scrolled to.

For tests the pane exposes what it drew: `rectangles` (page coordinates, PDF points, origin bottom
left) and `marked_lines` (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPixmap, QSyntaxHighlighter, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import (QHBoxLayout, QPlainTextEdit, QPushButton, QScrollArea, QStackedWidget,
                               QTextEdit, QVBoxLayout, QWidget)

from app.untrusted import escape, plain_label, rich_label
from engine.attended import AttendedSpan
from engine.documents import Document
from engine.documents.hyphenation import HYPHENS

HIGHLIGHT = QColor(255, 200, 0)
ZOOM_STEP = 1.25
COLOUR_MAX_LINES = 2_000  # longer files are shown uncoloured: Pygments took 0.5 s for 3,000 lines here
SHORTEST_MATCH = 12  # characters (white space left out) a partial match of a passage needs


@dataclass(frozen=True)
class Highlight:
    """A rectangle drawn over a PDF page: `passage` (index into the passages shown), its box in
    PDF points (left, bottom, right, top) and the alpha it was drawn with (0..255)."""

    passage: int
    box: tuple[float, float, float, float]
    alpha: int


def locate(page_text: str, passage: str, near: int = 0) -> tuple[int, int] | None:
    """Character range (start, end) of `passage` in `page_text`, ignoring white space and hyphens
    (the segment text joins words hyphenated at line ends, which PDFium marks with U+FFFE:
    `engine.documents.hyphenation`); of several occurrences, the one starting nearest `near`
    (where the passage starts in the segment text: a page may repeat a sentence). When the whole
    passage is not found, its longest leading part of at least `SHORTEST_MATCH` characters that
    is (a line break PDFium and the reader put differently). None: not on the page."""
    kept = [i for i, ch in enumerate(page_text) if not _skipped(ch)]
    compact = "".join(page_text[i] for i in kept)
    target = "".join(ch for ch in passage if not _skipped(ch))
    length = len(target)
    while length >= min(SHORTEST_MATCH, len(target)) and length > 0:
        found, at = [], compact.find(target[:length])
        while at >= 0:
            found.append(at)
            at = compact.find(target[:length], at + 1)
        if found:
            at = min(found, key=lambda a: abs(kept[a] - near))
            return kept[at], kept[at + length - 1] + 1
        length //= 2 if length > 2 * SHORTEST_MATCH else length + 1  # halve, then give up
    return None


def utf16_offset(text: str, index: int) -> int:
    """Where character `index` of `text` is in UTF-16 code units, the unit of QTextDocument's
    positions: a character beyond U+FFFF (an emoji) takes two, so code-point offsets drift after one."""
    return index + sum(1 for char in text[:index] if ord(char) > 0xFFFF)


def _skipped(char: str) -> bool:
    return char.isspace() or char in HYPHENS or char == "\ufffe"


def alpha_for(share: float, strongest: float) -> int:
    """Opacity of a highlight: from 40 (a faint passage) up to 200 for the strongest."""
    return int(40 + 160 * (share / strongest if strongest > 0 else 1.0))


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
    """Read-only text with line numbers in the margin."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.numbers = LineNumbers(self)
        self.blockCountChanged.connect(lambda _n: self.setViewportMargins(self.margin_width(), 0, 0, 0))
        self.updateRequest.connect(self._update_numbers)
        self.setViewportMargins(self.margin_width(), 0, 0, 0)

    def margin_width(self) -> int:
        return 12 + self.fontMetrics().horizontalAdvance("9") * len(str(max(1, self.blockCount())))

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
                                 str(block.blockNumber() + 1))
            top += round(self.blockBoundingRect(block).height())
            block = block.next()
        painter.end()


class PageScroll(QScrollArea):
    """The scroll area of a PDF page; says when its viewport's width changed (the page is
    rendered at that width)."""

    width_changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        # Always there, so that showing it cannot narrow the viewport and ask for another render.
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self.setWidgetResizable(True)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.width_changed.emit()


class SourcePane(QWidget):
    """The pane: a title, previous / next passage, zoom, close; a PDF page or a text file below."""

    closed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sourcePane")
        self.title = rich_label()
        self.title.setWordWrap(True)
        self.previous_button = QPushButton("◀ Previous")
        self.next_button = QPushButton("Next ▶")
        self.zoom_out_button = QPushButton("−")
        self.zoom_in_button = QPushButton("+")
        self.close_button = QPushButton("✕")
        self.close_button.setToolTip("Close the source pane")
        self.previous_button.setToolTip("The previous attended passage")
        self.next_button.setToolTip("The next attended passage (by share)")
        bar = QHBoxLayout()
        for button in (self.previous_button, self.next_button, self.zoom_out_button, self.zoom_in_button):
            bar.addWidget(button)
        bar.addStretch(1)
        bar.addWidget(self.close_button)
        self.page_label = plain_label()
        self.page_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignHCenter)
        self.scroll = PageScroll()
        self.scroll.setWidget(self.page_label)
        self.scroll.width_changed.connect(self._rerender)
        self.code = CodeView()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.scroll)
        self.stack.addWidget(self.code)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.title)
        layout.addLayout(bar)
        layout.addWidget(self.stack, 1)
        self.previous_button.clicked.connect(lambda: self.step(-1))
        self.next_button.clicked.connect(lambda: self.step(1))
        self.zoom_in_button.clicked.connect(lambda: self.set_zoom(self.zoom * ZOOM_STEP))
        self.zoom_out_button.clicked.connect(lambda: self.set_zoom(self.zoom / ZOOM_STEP))
        self.close_button.clicked.connect(self.close_pane)
        self.zoom = 1.0
        self.passages: list[AttendedSpan] = []
        self.current = 0                      # the passage scrolled to
        self.page: int | None = None          # 1-based page shown, None for a text file
        self.rectangles: list[Highlight] = []
        self.marked_lines: list[int] = []
        self._pdf_path: str | None = None
        self._page_height = 0.0
        self._scale = 1.0
        self._lines: list[tuple[int, int]] = []  # per passage: first and last line (0-based)
        self._colours: CodeColours | None = None

    def show_segment(self, document: Document, index: int, passages: list[AttendedSpan]) -> None:
        """Show segment `index` of `document` (a PDF page, or a file as the model read it) with
        those of `passages` that lie in it. A PDF that PDFium cannot read any more (moved,
        replaced) is shown as its page's text instead."""
        segment = document.segments[index]
        own = [p for p in passages if p.segment_index == index and p.label == segment.label]
        if document.kind == "pdf" and segment.page is not None:
            try:
                self.show_pdf_page(document.source, segment.page, own, segment.text)
                return
            except (pdfium.PdfiumError, OSError) as error:
                self.show_text_file(document.source, segment.text, own)
                self.title.setText(f"<b>{escape(segment.label)}</b> — the PDF could not be rendered ({escape(str(error))}); its text:")
                return
        path = Path(document.source) / segment.path if segment.path else Path(document.source)
        self.show_text_file(path, segment.text, own)

    # ------------------------------------------------------------------ PDF
    def show_pdf_page(self, pdf_path: str | Path, page: int, passages: list[AttendedSpan], page_text: str = "") -> None:
        """Show 1-based `page` of the PDF with `passages` (of that page, strongest first)
        highlighted; `page_text` is the segment text the passages' characters index. Raises
        pypdfium2.PdfiumError when the file cannot be read."""
        self.passages, self.current, self.page = list(passages), 0, page
        self._pdf_path, self._page_text = str(pdf_path), page_text
        self.title.setText(f"<b>{escape(Path(pdf_path).name)}</b> — page {page}")
        self.stack.setCurrentWidget(self.scroll)
        self.marked_lines = []
        self._render()
        self._update_buttons()
        self.show()

    def _render(self) -> None:
        document = pdfium.PdfDocument(self._pdf_path)
        try:
            page = document[self.page - 1]
            width, self._page_height = page.get_size()
            available = max(200, self.scroll.viewport().width() - 4)
            self._scale = available / width * self.zoom
            self.rectangles = self._highlights(page)
            bitmap = page.render(scale=self._scale, force_bitmap_format=pdfium_c.FPDFBitmap_BGRA, rev_byteorder=True)
            image = QImage(bitmap.buffer, bitmap.width, bitmap.height, bitmap.stride, QImage.Format.Format_RGBA8888).copy()
        finally:
            document.close()
        painter = QPainter(image)
        # Multiplied, not laid over: the page's black text stays black under the strongest highlight.
        painter.setCompositionMode(QPainter.CompositionMode.CompositionMode_Multiply)
        for rect in self.rectangles:
            color = QColor(HIGHLIGHT)
            color.setAlpha(rect.alpha)
            painter.fillRect(self._to_pixels(rect.box), color)
        painter.end()
        self.page_label.setPixmap(QPixmap.fromImage(image))
        self._scroll_to_current()

    def _highlights(self, page) -> list[Highlight]:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_range()
            strongest = max((p.share for p in self.passages), default=1.0)
            found = []
            for number, passage in enumerate(self.passages):
                where = locate(text, self._page_text[passage.char_start:passage.char_end], passage.char_start)
                if where is None:
                    continue
                start, end = where
                alpha = alpha_for(passage.share, strongest)
                found += [Highlight(number, textpage.get_rect(i), alpha)
                          for i in range(textpage.count_rects(start, end - start))]
            return found
        finally:
            textpage.close()

    def _to_pixels(self, box: tuple[float, float, float, float]) -> QRect:
        left, bottom, right, top = box
        s = self._scale
        return QRect(round(left * s), round((self._page_height - top) * s),
                     max(1, round((right - left) * s)), max(1, round((top - bottom) * s)))

    # ----------------------------------------------------------------- text
    def show_text_file(self, path: str | Path, text: str, passages: list[AttendedSpan]) -> None:
        """Show `text` (the file as the model read it) with the lines of `passages` (character
        ranges of `text`, strongest first) marked, scrolled to the strongest."""
        self.passages, self.current, self.page, self.rectangles = list(passages), 0, None, []
        self.title.setText(f"<b>{escape(Path(path).name)}</b> — {escape(str(path))}")
        if self._colours is not None:
            self._colours.setDocument(None)
        self.code.setPlainText(text)
        lexer = lexer_for(path) if text.count("\n") <= COLOUR_MAX_LINES else None
        self._colours = CodeColours(self.code.document(), lexer) if lexer is not None else None
        if self._colours is not None:
            self._colours.rehighlight()  # now: a new highlighter colours a document's text only later
        self.stack.setCurrentWidget(self.code)
        document = self.code.document()
        self._lines = [(document.findBlock(utf16_offset(text, p.char_start)).blockNumber(),
                        document.findBlock(utf16_offset(text, max(p.char_start, p.char_end - 1))).blockNumber())
                       for p in passages]
        strongest = max((p.share for p in passages), default=1.0)
        selections, marked = [], set()
        for passage, (first, last) in zip(passages, self._lines, strict=True):
            color = QColor(HIGHLIGHT)
            color.setAlpha(alpha_for(passage.share, strongest))
            for line in range(first, last + 1):
                marked.add(line + 1)
                selection = QTextEdit.ExtraSelection()
                selection.format.setBackground(color)
                selection.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
                selection.cursor = QTextCursor(document.findBlockByNumber(line))
                selections.append(selection)
        self.code.setExtraSelections(selections)
        self.marked_lines = sorted(marked)
        self._update_buttons()
        self.show()
        self._scroll_to_current()

    # ------------------------------------------------------------ passages
    def step(self, delta: int) -> None:
        """Go to the next (1) or previous (-1) passage, by share."""
        if self.passages:
            self.current = (self.current + delta) % len(self.passages)
            self._scroll_to_current()

    def set_zoom(self, zoom: float) -> None:
        """Zoom a PDF page: 1.0 fits the pane's width (clamped to 0.5..4)."""
        self.zoom = min(4.0, max(0.5, zoom))
        if self.page is not None:
            self._render()

    def close_pane(self) -> None:
        self.hide()
        self.closed.emit()

    def _scroll_to_current(self) -> None:
        if not self.passages:
            return
        if self.page is None:
            first, _last = self._lines[self.current]
            cursor = QTextCursor(self.code.document().findBlockByNumber(first))
            self.code.setTextCursor(cursor)
            self.code.centerCursor()
            return
        boxes = [r.box for r in self.rectangles if r.passage == self.current]
        if boxes:
            self.scroll.ensureVisible(self._to_pixels(boxes[0]).center().x(), self._to_pixels(boxes[0]).center().y(), 40, 120)

    def _update_buttons(self) -> None:
        for button in (self.previous_button, self.next_button):
            button.setEnabled(len(self.passages) > 1)
        for button in (self.zoom_in_button, self.zoom_out_button):
            button.setEnabled(self.page is not None)

    def _rerender(self) -> None:
        if self.page is not None and self._pdf_path and self.isVisible():
            self._render()
