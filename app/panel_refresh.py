"""Each panel of the main window refreshing itself from a `Changes` (`app.changes`), as Anki's
widgets do from `OpChanges`: every function here is connected to the window's `changed` signal,
looks at the fields it shows, and redraws its panel from the window's `DocumentState`, library,
settings and client. Connected in `connect_panels`'s order, the one the flows used to call them
in: the ask bar comes after the chat, to which it may hand the keyboard.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from app.changes import Changes
from app.document_header import document_info, info_tooltip
from app.library_panel import library_rows
from engine.library import read_share
from app.window_layout import GAUGE_IDLE_MS

GAUGE_BUSY_MS = 250      # gauge refresh while work runs (at least twice a second; GAUGE_IDLE_MS otherwise)


def connect_panels(window) -> None:
    """Connect each panel of `window` (a `MainWindow`) to its `changed` signal."""
    for refresh in (library_list, document_view, progress_and_gauge, ask_bar, memory_budget):
        window.changed.connect(partial(refresh, window))


def library_list(window, changes: Changes) -> None:
    """The sidebar's rows when the library changed; else only its selection, which follows the
    document the chat shows (no row for a new file being read: `OpenFlow` adds its reading row)."""
    current = window.state.current
    if changes.library:
        rows = library_rows(window.library, window.cache_status, window.settings, window.state.open_id)
        window.library_panel.show_documents(rows, current.id if current else None)
    elif changes.shown:
        window.library_panel.select(current.id if current else None)


def document_view(window, changes: Changes) -> None:
    """The header, the chat and the source pane when the chat shows another document, and when
    the library changed under the one it shows (its status line). A new file being read has no
    library row yet: the header names it, the chat is empty."""
    state, record = window.state, window.state.current
    if not (changes.shown or (changes.library and record is not None)):
        return
    window.conversation.show_document(record.id if record else None)
    window.sources.follow(record.id if record else None)
    window.banner.follow(record.id if record else None)
    if record is None and state.opening is not None:
        window.header.show_document(Path(state.opening).name, "Reading…", can_open=False)
        window.chat.clear()
        window.conversation.show_chat()
        return
    if record is None:
        window.conversation.show_empty()
        window.header.show_nothing()
        return
    window.conversation.show_chat()
    is_open = state.is_open(record)
    if not window.chat.streaming:  # a streaming answer is drawn by the answer stream, piece by piece
        window.chat.labels = set(state.segments) if is_open else None
        window.chat.recognised_pages = list(state.document.recognised_pages) if is_open and state.document else []
        window.chat.shown = state.document.shown_labels() if is_open and state.document is not None else {}
        window.chat.show_messages(window.library.messages(record.id))
    document_header(window)


def document_header(window) -> None:
    """The header of the library document the chat shows (its title and info line); the
    background read calls it as its time left changes."""
    state, record = window.state, window.state.current
    if record is None:
        return
    is_open, being_read = state.is_open(record), state.being_read(record)
    status = None if is_open or being_read else window.library.status(record, window.cache_status, window.settings)
    share = read_share(record, status, window.cache_status) if status else None
    if share is not None:
        status = f"read {share:.0%}".replace("%", " %") + " before its read stopped: opening it goes on from there"
    read = window.background_read
    info = document_info(record, state.report if is_open else None,
                         estimate=window.estimate_text(record.tokens) if record.tokens else "", not_open_status=status,
                         whole_read_stopped=read.stopped, whole_read_left_s=read.left_s if read.running else None)
    window.header.show_document(record.title, info, can_open=not is_open and not being_read,
                                tooltip=info_tooltip(state.report if is_open else None))


def progress_and_gauge(window, changes: Changes) -> None:
    """While the worker is busy the gauge is sampled more often; once idle, the progress strip goes."""
    if not changes.busy:
        return
    busy = window.client.busy
    window.gauge_timer.setInterval(GAUGE_BUSY_MS if busy else GAUGE_IDLE_MS)
    window.refresh_gauge()
    if not busy:
        window.progress.finish()


def ask_bar(window, changes: Changes) -> None:
    """The ask bar, enabled when a question can be asked and saying why not when it cannot, and
    the Cancel action. It reads the documents' state, the answer, the settings (the cloud button)
    and the worker, so it follows every change."""
    state = window.state
    library = window.conversation.ask_all.isChecked()
    ready = state.library_ready if library else state.ready
    if state.opening is not None:
        hint = "Reading the document — type your question; Ask works as soon as it is ready (Esc to cancel)"
    elif state.live is not None:
        hint = "Answering… (Esc to stop)"
    elif library and ready:
        hint = "Ask all documents of the library…"
    elif state.current is not None and not state.is_open(state.current):
        hint = "Open this document to ask about it"
    elif state.ready:
        hint = f"Ask about {state.current.title}…"
    else:
        hint = "Open or drop a document to ask about it"
    window.conversation.set_ready(ready, hint, cloud=window.settings.cloud.enabled,
                                  typing=state.opening is not None or state.live is not None)
    window.action_cancel.setEnabled(window.client.busy)


def memory_budget(window, changes: Changes) -> None:
    """The budget line under the gauge: it is worked out from the settings and the model's shape."""
    if changes.settings or changes.model:
        window.memory_panel.show_budget(window.settings, window.profile())
