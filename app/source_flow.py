"""A clicked citation or attended source, from the link to the source pane: the page or file is
looked up in the document the *answer* belongs to, which is not always the one open in the engine
(a library document's chat is shown read-only while another is open). The open document's text is
at hand (`DocumentState.document`); another one is read again from its file, in a thread of its own
(the engine worker may be busy reading for minutes, and a click must not wait behind that), and the
last one read is kept for the next click.

A library answer (asked of all documents) is kept with one document but cites several: its
sources name their document's file (`Source.document_source`), and its links name the document
("title, page 3", `Source.cited_name`); such a click resolves in the library document of that file,
with the passages measured on it.

Reading a document's text needs no model: `engine.documents.load_document` (through its parsed copy,
`engine.documents.parsed_cache`, when it was read before), as the engine's open
does, so the pane's page numbers and passages' character offsets are those the answer was given.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtWidgets import QSizePolicy

from engine.answer import Source
from engine.citations import normalise_label
from engine.documents import Document
from engine.documents.parsed_cache import load_reusing
from engine.errors import HalamanError
from engine.library import DocumentRecord, file_signature


@dataclass(frozen=True)
class Citation:
    """A click on a page or file: `label` as the link gave it, the answer `message_id` it belongs to
    (None while it streams), the library document it resolves in (`document_id`)."""

    label: str
    message_id: int | None
    document_id: int | None
    document_source: str | None = None   # a library answer's: the file of the document cited


def library_source(label: str, sources: list[Source]) -> Source | None:
    """The source of a library answer (`sources` naming their documents) a clicked `label` means: the
    one named so (`Source.cited_name`), else the strongest with that page or file (the model cites
    "[page 3]" without the document), else the strongest; None for one document's answer."""
    named = [s for s in sources if s.document_source]
    if not named:
        return None
    plain = normalise_label(label)
    return next((s for s in named if s.cited_name == label), None) or next(
        (s for s in named if s.label in (label, plain)), named[0])


CHAT_MIN_WIDTH = 480   # px the chat keeps beside the source pane: the question box stays readable
PANE_MIN_WIDTH = 300   # px below which a page is too small to read
SIDEBAR_WIDTH = 280    # px of the library list (its minimum while no pane is open)
CHAT_WIDE_WIDTH = 720  # px of chat beside the pane that a wide window gives the pane beyond (a chat line of ~100 characters)


class SourceFlow(QObject):
    """Shows citations of `window` (a `MainWindow`: its library, state, source pane, splitter and
    store) in the source pane. Signal `shown(citation)` after a page or file is shown (tests wait on it)."""

    shown = Signal(object)
    _read = Signal(object, object, object)   # Citation, DocumentRecord, Document or the exception its read raised

    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self._wanted: Citation | None = None                       # the last click; an older read's result is dropped
        self._kept: tuple[int, str | None, Document] | None = None  # document id, its file's signature, its text
        # The library document whose answer's page or file the pane shows (a library answer's may be
        # of another document: it still belongs beside the chat that holds the answer).
        self.shown_id: int | None = None
        self._read.connect(self._on_read)
        # The pane grows and shrinks with the window as the chat does: with no stretch it kept the
        # ~310 px it opened at while a window grew to 1,920 px, the page too small to read.
        window.splitter.setStretchFactor(window.splitter.indexOf(window.source_pane), 1)
        window.splitter.installEventFilter(self)  # and a window made wide gives it what the chat does not need
        window.source_pane.closed.connect(self._pane_closed)

    def _pane_closed(self) -> None:
        """The list stepped aside for the pane: it comes back, at its own width again."""
        self.waive_sidebar_minimum(False)
        self.window.sidebar.show()

    def follow(self, document_id: int | None) -> None:
        """The chat shows library document `document_id` now (None: a new file being read): a page
        of another document would sit beside it as if it were this one's, so the pane is emptied."""
        if self.shown_id is not None and document_id != self.shown_id:
            self.shown_id = None
            self._wanted = None  # a read still under way for the old document shows nothing
            self.window.source_pane.clear()

    def show_citation(self, label: str, message_id: int | None = None) -> None:
        """Show page or file `label` of the document answer `message_id` belongs to (while an answer
        streams, `message_id` is None: the document the chat shows), with that answer's attended
        passages highlighted."""
        w = self.window
        message = w.library.message(message_id) if message_id is not None else None
        source = library_source(label, message.sources) if message is not None else None
        if source is not None:
            found = w.library.find(source.document_source)
            document_id, label = (found.id if found else None), source.label
        elif message is not None:
            document_id = message.document_id
        else:
            document_id = w.state.current.id if w.state.current is not None else w.state.open_id
        citation = self._wanted = Citation(label, message_id, document_id, source.document_source if source else None)
        if document_id is not None and document_id == w.state.open_id and w.state.document is not None:
            self._show(citation, w.state.document)
            return
        record = w.library.document(document_id) if document_id is not None else None
        if record is None:
            w.statusBar().showMessage(f"“{label}”: its document is no longer in the library.", 6000)
            return
        kept = self._kept
        if kept is not None and kept[0] == record.id and kept[1] == file_signature(record.path):
            self._show(citation, kept[2])
            return
        w.statusBar().showMessage(f"Reading {record.title} to show {label}…", 6000)
        include_generated = w.settings.include_generated_files

        def read() -> None:
            try:
                result: object = load_reusing(record.path, include_generated=include_generated)
            except Exception as exc:  # noqa: BLE001 - handed to the GUI thread, which says it in one line
                result = exc
            try:
                self._read.emit(citation, record, result)
            except RuntimeError:  # the window was closed meanwhile
                pass

        threading.Thread(target=read, name="source pane read", daemon=True).start()

    def _on_read(self, citation: Citation, record: DocumentRecord, result) -> None:
        if citation is not self._wanted or self.window.closed:
            return  # another click came since
        if isinstance(result, BaseException):
            why = str(result) if isinstance(result, HalamanError) else f"{type(result).__name__}: {result}"
            self.window.statusBar().showMessage(f"Could not show {citation.label} of {record.title}: {why}", 10000)
            return
        self._kept = (record.id, file_signature(record.path), result)
        self._show(citation, result)

    def _show(self, citation: Citation, document: Document) -> None:
        w = self.window
        labels = [s.label for s in document.segments]
        found = citation.label if citation.label in labels else normalise_label(citation.label)
        if found not in labels:
            w.statusBar().showMessage(f"“{citation.label}” is not a page or file of {document.title}.", 6000)
            return
        message = w.library.message(citation.message_id) if citation.message_id is not None else None
        self.open_pane()
        # A library answer's passages are of several documents: those of the one shown.
        passages = [p for p in message.passages if p.document_source == citation.document_source] if message else []
        w.source_pane.show_segment(document, labels.index(found), passages)
        self.shown_id = message.document_id if message is not None else citation.document_id
        self.shown.emit(citation)

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window.splitter and event.type() == QEvent.Type.Resize:
            QTimer.singleShot(0, self._widen_pane)  # once the splitter has shared out its new width
        return False

    def _widen_pane(self) -> None:
        """A window grown with the pane open: the splitter shares the growth by the panels' widths,
        and a pane opened at 380 px of an 1,100 px window was 657 px of 1,920; it gets at least all
        the chat leaves beyond `CHAT_WIDE_WIDTH`, as at an open. The library list steps aside when
        the window narrows below the list, the chat and the pane together (`_fit_sidebar`)."""
        w = self.window
        if w.closed or w.source_pane.isHidden():
            return
        self._fit_sidebar()
        side, chat, pane = w.splitter.sizes()
        floor = chat + pane - CHAT_WIDE_WIDTH
        if pane < floor:
            w.splitter.setSizes([side, chat + pane - floor, floor])
        elif chat < CHAT_MIN_WIDTH and pane > PANE_MIN_WIDTH:  # a narrowed window: the question box first
            give = min(CHAT_MIN_WIDTH - chat, pane - PANE_MIN_WIDTH)
            w.splitter.setSizes([side, chat + give, pane - give])

    def _fit_sidebar(self) -> None:
        """With the pane open the list does not hold the window wide (its minimum is waived, so a
        window narrowed from 1,920 px went below 889 px): a list squeezed under its width is hidden,
        and one hidden for the pane comes back when the window has room for all three again."""
        w = self.window
        side, chat, pane = w.splitter.sizes()
        if not w.sidebar.isHidden() and side < SIDEBAR_WIDTH:
            w.sidebar.hide()
            w.splitter.refresh()  # its width shared out now, for the sizes read next
        elif w.sidebar.isHidden() and chat + pane >= SIDEBAR_WIDTH + CHAT_MIN_WIDTH + PANE_MIN_WIDTH:
            w.sidebar.show()
            w.splitter.setSizes([SIDEBAR_WIDTH, chat - SIDEBAR_WIDTH, pane])

    def waive_sidebar_minimum(self, waived: bool) -> None:
        """While the pane is open the list may be squeezed (and then steps aside, `_fit_sidebar`)
        instead of holding the window at the three panels' minimum widths; closed, it keeps its width."""
        sidebar = self.window.sidebar
        sidebar.setMinimumWidth(0 if waived else SIDEBAR_WIDTH)
        policy = sidebar.sizePolicy()
        policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored if waived else QSizePolicy.Policy.Preferred)
        sidebar.setSizePolicy(policy)

    def open_pane(self) -> None:
        """Show the source pane beside the chat, as wide as it was last (else half the chat) but at
        least all the chat leaves beyond `CHAT_WIDE_WIDTH` (a width kept from a smaller window left
        the page at ~310 px in a 1,920 px one; now it takes ≥ 45 % there), never growing the window: the chat keeps `CHAT_MIN_WIDTH`, and where the window is too narrow for
        the library list, the chat and the pane together (an 800 px window), the list steps aside
        until the pane closes."""
        w = self.window
        if not w.source_pane.isHidden():
            return
        w.splitter.refresh()  # a library list shown just now (the pane closed) counts its width
        side, chat, pane = w.splitter.sizes()
        room = side + chat + pane
        if room - side - PANE_MIN_WIDTH < CHAT_MIN_WIDTH:
            # Hidden before the pane shows: the three panels' minimum widths together widened an
            # 800 px window to 907 px, and a folded list still counts its minimum.
            side = 0
            w.sidebar.hide()
        self.waive_sidebar_minimum(True)
        w.source_pane.show()
        w.splitter.refresh()  # the pane's minimum known now, not after the next event loop turn
        wanted = max(w.store.pane_width or (room - side) // 2, room - side - CHAT_WIDE_WIDTH)
        width = max(PANE_MIN_WIDTH, min(wanted, room - side - CHAT_MIN_WIDTH))
        w.splitter.setSizes([side, room - side - width, width])