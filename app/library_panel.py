"""The library sidebar: every document read so far, with its size, tokens and prefix-cache status,
and the one being read right now ("reading 40 %") from the moment reading starts.

Intents out (signals): `selected(id)`, `open_requested(id)`, `remove_requested(id)`,
`open_file_requested()`, `open_folder_requested()`. State in: `show_documents(rows, select)` and
`set_reading(path, title, text)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.untrusted import literal_rich_text, plain_label
from engine.library import CACHED, MISSING, STALE, Library, read_share
from engine.settings import EngineSettings

if TYPE_CHECKING:
    from engine.workspace import CacheStatus

STATUS_TEXT = {CACHED: "cached", STALE: "stale", "not cached": "not cached", MISSING: "missing: moved or deleted"}
ID_ROLE = Qt.ItemDataRole.UserRole
PATH_ROLE = Qt.ItemDataRole.UserRole + 1
TEXT_ROLE = Qt.ItemDataRole.UserRole + 2      # the row's own two lines, put back when its read ends


@dataclass(frozen=True)
class LibraryRow:
    """One document as the sidebar shows it. status: CACHED, STALE, "not cached" or MISSING."""

    id: int
    path: str
    title: str
    details: str
    status: str
    is_open: bool


def library_rows(library: Library, cache: CacheStatus | None, settings: EngineSettings,
                 open_id: int | None) -> list[LibraryRow]:
    """The library's documents, newest first, as rows ("12 pages · 5,231 tokens · cached"; a
    document whose read stopped half-way: "read 33 %")."""
    rows = []
    for record in library.documents():
        status = library.status(record, cache, settings)
        share = read_share(record, status, cache)
        said = f"read {share:.0%}".replace("%", " %") if share is not None else STATUS_TEXT[status]
        details = " · ".join(x for x in (
            record.size_text, f"{record.tokens:,} tokens" if record.tokens else "", said) if x)
        rows.append(LibraryRow(record.id, record.path, record.title, details, status, record.id == open_id))
    return rows


class LibraryPanel(QWidget):
    """The sidebar list with its Open… / Folder… buttons and a context menu (Open, Remove)."""

    selected = Signal(int)
    open_requested = Signal(int)
    remove_requested = Signal(int)
    open_file_requested = Signal()
    open_folder_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setObjectName("library")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setUniformItemSizes(False)
        self.list.setSpacing(2)
        self.list.setWordWrap(False)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setAcceptDrops(False)
        title = plain_label("Library")
        title.setObjectName("sectionTitle")
        add_file = QPushButton("Open…")
        add_file.clicked.connect(self.open_file_requested)
        add_folder = QPushButton("Folder…")
        add_folder.clicked.connect(self.open_folder_requested)
        head = QHBoxLayout()
        head.addWidget(title, 1)
        head.addWidget(add_file)
        head.addWidget(add_folder)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(head)
        layout.addWidget(self.list, 1)
        self._reading: tuple[str, str, str] | None = None   # (path, title, text) of the document being read
        self._order: frozenset[int] | None = None  # the ids of the rows, as sorted
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemDoubleClicked.connect(self._double_clicked)
        self.list.customContextMenuRequested.connect(self._menu)

    def show_documents(self, rows: list[LibraryRow], select: int | None) -> None:
        """Redraw the list; `select` becomes the current row (no `selected` signal for it). The row
        of a document being read (`set_reading`) is kept.

        The rows keep their places while the same documents are listed: a status that changes (a
        read's progress, its cache saved) or a document opened redraws the rows in place, and the
        list re-sorts only when a document is added or removed. Rebuilt at each change, it moved
        rows under the mouse while a read went on, and a double-clicked document jumped to the top."""
        order = frozenset(row.id for row in rows)
        with QSignalBlocker(self.list):
            if order == self._order:
                self._redraw_in_place(rows)
            else:
                self._rebuild(rows)
            self._order = order
            if select is None:
                self.list.setCurrentItem(None)
            else:
                self._select_id(select)
            self._update_reading_row()

    def _rebuild(self, rows: list[LibraryRow]) -> None:
        self.list.clear()
        for row in rows:
            item = QListWidgetItem()
            item.setData(ID_ROLE, row.id)
            _draw(item, row)
            self.list.addItem(item)

    def _redraw_in_place(self, rows: list[LibraryRow]) -> None:
        by_id = {row.id: row for row in rows}
        for index in range(self.list.count()):
            item = self.list.item(index)
            if item.data(ID_ROLE) in by_id:
                _draw(item, by_id[item.data(ID_ROLE)])

    def _select_id(self, document_id: int) -> None:
        for index in range(self.list.count()):
            if self.list.item(index).data(ID_ROLE) == document_id:
                self.list.setCurrentRow(index)
                return

    def set_reading(self, path: str | None, title: str = "", text: str = "") -> None:
        """Show that `path` is being read ("reading 40 %"): on its row, or on a row of its own at the
        top for a document not in the library yet. None: nothing is being read."""
        self._reading = (path, title, text) if path else None
        with QSignalBlocker(self.list):
            self._update_reading_row()

    def select(self, document_id: int | None) -> None:
        """Make `document_id` the current row, or none for None (no `selected` signal)."""
        items = (self.list.item(row) for row in range(self.list.count()))
        found = next((item for item in items if document_id is not None and item.data(ID_ROLE) == document_id), None)
        if found is not None or document_id is None:
            with QSignalBlocker(self.list):
                self.list.setCurrentItem(found)

    def _update_reading_row(self) -> None:
        """Call with the list's signals blocked: taking or inserting the current row moves the
        selection, which must not read as the user picking another document (it would show that
        one's chat while this one is read)."""
        reading = self._reading
        for row in reversed(range(self.list.count())):  # earlier reads: their rows as they were
            item = self.list.item(row)
            if reading is not None and item.data(PATH_ROLE) == reading[0]:
                continue
            if item.data(ID_ROLE) is None:
                self.list.takeItem(row)
            elif item.text() != item.data(TEXT_ROLE):
                item.setText(item.data(TEXT_ROLE))
        if reading is None:
            return
        path, title, text = reading
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(PATH_ROLE) == path:
                name = item.text().split("\n")[0]
                item.setText(f"{name}\n{text}")
                item.setToolTip(literal_rich_text(f"{name}\n{path}\n{text}"))
                return
        item = QListWidgetItem(f"{title}\n{text}")
        item.setData(ID_ROLE, None)
        item.setData(PATH_ROLE, path)
        item.setToolTip(literal_rich_text(f"{title}\n{path}\n{text}"))
        self.list.insertItem(0, item)
        if self.list.currentItem() is None:  # never take the highlight from a document the user picked
            self.list.setCurrentItem(item)

    def _current_changed(self, item: QListWidgetItem | None, _previous=None) -> None:
        if item is not None and item.data(ID_ROLE) is not None:
            self.selected.emit(item.data(ID_ROLE))

    def _double_clicked(self, item: QListWidgetItem) -> None:
        if item.data(ID_ROLE) is not None:
            self.open_requested.emit(item.data(ID_ROLE))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(ID_ROLE) is None:
            return
        doc_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Open", lambda: self.open_requested.emit(doc_id))
        menu.addAction("Remove from library (and its chat)", lambda: self.remove_requested.emit(doc_id))
        menu.exec(self.list.viewport().mapToGlobal(pos))


def _draw(item: QListWidgetItem, row: LibraryRow) -> None:
    """`row`'s two lines, path, tooltip and boldness (the open document) on `item`."""
    item.setText(f"{row.title}\n{row.details}")
    item.setData(TEXT_ROLE, item.text())
    item.setData(PATH_ROLE, row.path)
    item.setToolTip(literal_rich_text(f"{row.title}\n{row.path}\nprefix cache: {row.status}"))
    font = item.font()
    font.setBold(row.is_open)
    item.setFont(font)
