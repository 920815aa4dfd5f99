"""The source pane: the cited page or file beside the chat, the passages the answer attended to
highlighted (`engine.attended.AttendedSpan`, character ranges in the segment's text).

PDF pages are rendered by PDFium (pypdfium2) at the pane's width; a passage is found in PDFium's
text of the page by its characters without white space (the segment text is the normalised page
text, so offsets differ but the characters do not), and PDFium's rectangles of those characters
are drawn over the page, more opaque for a larger share. A page whose text was recognised (OCR:
`Document.recognised_pages`, a scanned page or an image's frame) gets the boxes of its recognised
lines instead (`engine.documents.ocr.RecognisedPage.boxes`); an image is shown through Pillow. Code and text files are shown as the model
read them (`app.code_view`: the file's own line numbers, Pygments' colours where it is installed),
the attended lines marked and the strongest scrolled to. Previous / Next go through every passage
the answer attended, from page to page (an answer over the whole document attends several), and a
note under them says which passage is shown and where the others are, or why there are none.

For tests the pane exposes what it drew: `rectangles` (page coordinates, PDF points, origin bottom
left) and `marked_lines` (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPixmap, QTextCursor, QTextFormat
from PySide6.QtWidgets import QHBoxLayout, QScrollArea, QStackedWidget, QTextEdit, QToolButton, QVBoxLayout, QWidget

from app.code_view import CodeColours, CodeView, is_prose, lexer_for
from app.untrusted import escape, plain_label, rich_label
from engine.attended import AttendedSpan, units
from engine.documents import Document
from engine.documents.hyphenation import HYPHENS
from engine.documents.image import is_image
from engine.documents.lines import file_line_numbers
from engine.documents.ocr import cached_page

HIGHLIGHT = QColor(255, 200, 0)
ZOOM_STEP = 1.25
COLOUR_MAX_LINES = 2_000  # longer files are shown uncoloured: Pygments colours them too slowly for a click
SHORTEST_MATCH = 12  # characters (white space left out) a partial match of a passage needs
PAGE_PASSAGE_UNITS_MAX = 6  # sentences or rows of a page one highlight covers at most (`too_long`)


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


def too_long(passage: str) -> bool:
    """Whether a page's passage spans more than `PAGE_PASSAGE_UNITS_MAX` sentences or rows
    (`engine.attended.units`): a run that answers stored before passages on a page were single
    sentences or rows may hold (a whole table, which was highlighted evenly). Not drawn: which of
    its rows the answer attended is not known."""
    return len(units(passage.strip())) > PAGE_PASSAGE_UNITS_MAX


def utf16_offset(text: str, index: int) -> int:
    """Where character `index` of `text` is in UTF-16 code units, the unit of QTextDocument's
    positions: a character beyond U+FFFF (an emoji) takes two, so code-point offsets drift after one."""
    return index + sum(1 for char in text[:index] if ord(char) > 0xFFFF)


def _skipped(char: str) -> bool:
    return char.isspace() or char in HYPHENS or char == "\ufffe"


def alpha_for(share: float, strongest: float) -> int:
    """Opacity of a highlight: from 40 (a faint passage) up to 200 for the strongest."""
    return int(40 + 160 * (share / strongest if strongest > 0 else 1.0))


def _button(text: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    return button


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
        # Tool buttons: a push button is at least 80 px wide in most styles, and five of them kept
        # the window with the pane open wider than a small screen.
        self.previous_button = _button("◀ Previous")
        self.next_button = _button("Next ▶")
        self.zoom_out_button = _button("−")
        self.zoom_in_button = _button("+")
        self.close_button = _button("✕")
        self.close_button.setToolTip("Close the source pane")
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
        self.note = plain_label()
        self.note.setObjectName("sourceNote")
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        layout.addWidget(self.stack, 1)
        self.previous_button.clicked.connect(lambda: self.step(-1))
        self.next_button.clicked.connect(lambda: self.step(1))
        self.zoom_in_button.clicked.connect(lambda: self.set_zoom(self.zoom * ZOOM_STEP))
        self.zoom_out_button.clicked.connect(lambda: self.set_zoom(self.zoom / ZOOM_STEP))
        self.close_button.clicked.connect(self.close_pane)
        self.zoom = 1.0
        self.document: Document | None = None     # the document shown, when shown by `show_segment`
        self.segment_index: int | None = None
        self.answer_passages: list[AttendedSpan] = []  # all the answer attended in that document, strongest first
        self.passages: list[AttendedSpan] = []  # those on the page or in the file shown
        self.current = 0                      # the passage scrolled to (in `passages`)
        self.page: int | None = None          # 1-based page shown, None for a text file
        self.rectangles: list[Highlight] = []
        self.marked_lines: list[int] = []
        self._pdf_path: str | None = None
        self._page_text = ""                  # the segment text of the page shown (passages index it)
        self._page_height = 0.0
        self._recognised = False
        self._scale = 1.0
        self._lines: list[tuple[int, int]] = []  # per passage: first and last line (0-based)
        self._colours: CodeColours | None = None
        self._zoomed_source: str | None = None  # the document `zoom` was chosen in (`show_segment`)
        self.clear()

    def clear(self) -> None:
        """Show nothing (at start, or when the chat moves to another document), open or not."""
        self.empty = True
        self._zoomed_source = None  # the next document shown, even the same again, opens at fit-width
        self.document, self.segment_index, self.answer_passages, self.passages = None, None, [], []
        self.page, self.rectangles, self.marked_lines, self.current = None, [], [], 0
        self.title.setText("Nothing shown yet")
        self.page_label.clear()
        if self._colours is not None:
            self._colours.setDocument(None)
            self._colours = None
        self.code.show_text("", None)
        self.code.setExtraSelections([])
        self.stack.setCurrentWidget(self.scroll)
        self._update_buttons()

    def show_segment(self, document: Document, index: int, passages: list[AttendedSpan], *,
                     focus: AttendedSpan | None = None) -> None:
        """Show segment `index` of `document` (a PDF page, or a file as the model read it) with
        those of `passages` (an answer's, strongest first) that lie in it; Previous / Next go
        through all of them, from page to page. `focus`: the passage to scroll to (default: the
        strongest shown). A PDF that PDFium cannot read any more (moved, replaced) is shown as its
        page's text instead."""
        segment = document.segments[index]
        if document.source != self._zoomed_source:
            self.zoom = 1.0  # a zoom the user chose stays with its document: another opens at fit-width
        answer = [p for p in passages if 0 <= p.segment_index < len(document.segments)
                  and document.segments[p.segment_index].label == p.label]  # stored with another reading: not shown
        own = [p for p in answer if p.segment_index == index]
        if document.kind == "pdf" and segment.page is not None:
            try:
                self.show_pdf_page(document.source, segment.page, own, segment.text,
                                   recognised=segment.page in document.recognised_pages)
                # The page as printed, where the PDF numbers its pages otherwise ("page 48 (PDF page 68)").
                self.title.setText(f"<b>{escape(Path(document.source).name)}</b> — {escape(segment.shown)}")
            except (pdfium.PdfiumError, OSError, ValueError) as error:
                self.show_text_file(document.source, segment.text, own, numbered=False)
                self.title.setText(f"<b>{escape(segment.shown)}</b> — the PDF could not be rendered ({escape(str(error))}); its text:")
        else:
            path = Path(document.source) / segment.path if segment.path else Path(document.source)
            # A unit of an office document, e-book or table ("slide 7", "sheet Revenue, rows 2–40"):
            # its text is made from the file's XML, so it has no file lines; the title names the unit.
            unit = document.kind not in ("repo", "text")
            self.show_text_file(path, segment.text, own, numbered=not unit)
            if unit:
                self.title.setText(f"<b>{escape(path.name)}</b> — {escape(segment.label)}")
        self.document, self.segment_index, self.answer_passages = document, index, answer
        self._zoomed_source = document.source
        if focus in own:
            self.current = own.index(focus)
            self._scroll_to_current()
        self._update_buttons()

    # ------------------------------------------------------------------ PDF
    def show_pdf_page(self, pdf_path: str | Path, page: int, passages: list[AttendedSpan], page_text: str = "",
                      *, recognised: bool = False) -> None:
        """Show 1-based `page` of the PDF (or frame of an image) with `passages` (of that page,
        strongest first) highlighted; `page_text` is the segment text the passages' characters
        index; `recognised`: its text was recognised (OCR), so the boxes are its recognised lines'.
        Raises pypdfium2.PdfiumError or OSError when the file cannot be read."""
        self.passages, self.current, self.page, self.empty = list(passages), 0, page, False
        self.document, self.segment_index, self.answer_passages = None, None, list(passages)
        self._pdf_path, self._page_text, self._recognised = str(pdf_path), page_text, recognised
        self.title.setText(f"<b>{escape(Path(pdf_path).name)}</b> — page {page}")
        self.stack.setCurrentWidget(self.scroll)
        self.marked_lines = []
        self._render()
        self._update_buttons()
        self.show()

    def _render(self) -> None:
        recognised = cached_page(Path(self._pdf_path), self.page - 1) if self._recognised else None
        if is_image(Path(self._pdf_path)):
            image = self._image_frame()
        else:
            image = self._pdf_page_image(recognised)
        if recognised is not None:
            self.rectangles = self._recognised_highlights(recognised)
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

    def _image_frame(self) -> QImage:
        """The image's frame `self.page` scaled to the pane (page units are its pixels)."""
        from PIL import Image, ImageOps

        with Image.open(self._pdf_path) as source:
            source.seek(self.page - 1)
            width, self._page_height = source.size
            if source.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # turned a quarter: as the OCR process saw it
                width, self._page_height = self._page_height, width
            self._scale = max(200, self.scroll.viewport().width() - 4) / width * self.zoom
            size = (max(1, round(width * self._scale)), max(1, round(self._page_height * self._scale)))
            source.draft("RGB", size)  # JPEG: decoded at the size shown, not whole
            frame = ImageOps.exif_transpose(source.convert("RGBA")).resize(size)
        self.rectangles = []
        return QImage(frame.tobytes(), frame.width, frame.height, frame.width * 4, QImage.Format.Format_RGBA8888).copy()

    def _pdf_page_image(self, recognised) -> QImage:
        document = pdfium.PdfDocument(self._pdf_path)
        try:
            page = document[self.page - 1]
            width, self._page_height = page.get_size()
            available = max(200, self.scroll.viewport().width() - 4)
            self._scale = available / width * self.zoom
            self.rectangles = self._highlights(page) if recognised is None else []
            bitmap = page.render(scale=self._scale, force_bitmap_format=pdfium_c.FPDFBitmap_BGRA, rev_byteorder=True)
            return QImage(bitmap.buffer, bitmap.width, bitmap.height, bitmap.stride, QImage.Format.Format_RGBA8888).copy()
        finally:
            document.close()

    def _recognised_highlights(self, recognised) -> list[Highlight]:
        """As `_highlights`, over the recognised lines of an OCR page."""
        text = recognised.text
        strongest = max((p.share for p in self.passages), default=1.0)
        found = []
        for number, passage in enumerate(self.passages):
            if too_long(self._page_text[passage.char_start:passage.char_end]):
                continue
            where = locate(text, self._page_text[passage.char_start:passage.char_end], passage.char_start)
            if where is not None:
                alpha = alpha_for(passage.share, strongest)
                found += [Highlight(number, box, alpha) for box in recognised.boxes(*where)]
        return found

    def _highlights(self, page) -> list[Highlight]:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_range()
            strongest = max((p.share for p in self.passages), default=1.0)
            found = []
            for number, passage in enumerate(self.passages):
                if too_long(self._page_text[passage.char_start:passage.char_end]):
                    continue
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
    def show_text_file(self, path: str | Path, text: str, passages: list[AttendedSpan], *, numbered: bool = True) -> None:
        """Show `text` (the file at `path` as the model read it) with the lines of `passages`
        (character ranges of `text`, strongest first) marked, scrolled to the strongest; the lines
        are numbered as in the file on disk where it can be aligned with `text` (`numbered`:
        `path` is that file, not a PDF whose page's text is shown)."""
        self.passages, self.current, self.page, self.rectangles, self.empty = list(passages), 0, None, [], False
        self.document, self.segment_index, self.answer_passages = None, None, list(passages)
        self.title.setText(f"<b>{escape(Path(path).name)}</b> — {escape(str(path))}")
        if self._colours is not None:
            self._colours.setDocument(None)
        # A unit of an office document or a PDF page's text (not `numbered`) is prose, as is a .txt or
        # .md file: wrapped at the pane's width; code keeps its lines and scrolls sideways.
        self.code.show_text(text, file_line_numbers(path, text) if numbered else None,
                            wrap=not numbered or is_prose(path))
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
                # The whole line of the text: wrapped prose shows it as several lines, each marked.
                selection.cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
                selections.append(selection)
        self.code.setExtraSelections(selections)
        self.marked_lines = sorted(marked)
        self._update_buttons()
        self.show()
        self._scroll_to_current()

    # ------------------------------------------------------------ passages
    def step(self, delta: int) -> None:
        """Go to the answer's next (1) or previous (-1) passage, by share, showing its page or file
        when it is on another one."""
        ordered = self.answer_passages
        if len(ordered) < 2:
            return
        here = ordered.index(self.passages[self.current]) if self.passages else (-1 if delta > 0 else 0)
        target = ordered[(here + delta) % len(ordered)]
        if target in self.passages:
            self.current = self.passages.index(target)
            self._scroll_to_current()
            self._update_buttons()
        elif self.document is not None:
            self.show_segment(self.document, target.segment_index, ordered, focus=target)

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
        """Previous / Next go through the answer's passages, enabled when there are two or more;
        the note under them says which passage is shown and where the others are, or why there is
        nothing to step through."""
        ordered, steps = self.answer_passages, len(self.answer_passages) > 1
        if self.empty:
            note = "Click a page or file under an answer (Cited or Attended) to show it here."
        elif not ordered:
            note = ("No highlights: this answer recorded no attended passages (a cloud answer, an answer from "
                    "before highlights were kept, or one that read the document without recall).")
        else:
            shown = self.document.shown_labels() if self.document is not None else {}
            places = list(dict.fromkeys(shown.get(p.label, p.label) for p in ordered))
            where = ", ".join(places)
            if self.passages:
                note = (f"Passage {ordered.index(self.passages[self.current]) + 1} of {len(ordered)} this answer "
                        f"attended most (on {where}).")
            else:
                note = f"This answer attended nothing here; its {len(ordered)} passage{'s' if len(ordered) > 1 else ''}: {where}."
            if len(ordered) == 1 and self.passages:
                note += " Only one: nothing to step through."
            long = [p for p in self.passages if self.page is not None and too_long(self._page_text[p.char_start:p.char_end])]
            if long:
                note += (f" Not highlighted here: {len(long)} over {PAGE_PASSAGE_UNITS_MAX} lines long (which of "
                         "its lines the answer attended is not known).")
        self.note.setText(note)
        for button, what in ((self.previous_button, "The previous attended passage"),
                             (self.next_button, "The next attended passage, by share, on this page or another")):
            button.setEnabled(steps)
            button.setToolTip(what if steps else f"Nothing to step through. {note}")
        for button in (self.zoom_in_button, self.zoom_out_button):
            button.setEnabled(self.page is not None)

    def _rerender(self) -> None:
        if self.page is not None and self._pdf_path and self.isVisible():
            self._render()
