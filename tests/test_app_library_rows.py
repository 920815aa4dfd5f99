"""Issue 44's trial, the library list: a document read in part said "not cached", as one never read
does, and the list re-sorted under the mouse while a read went on. The real window, its real
worker and a real prefix store."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from app.changes import Changes  # noqa: E402
from app.library_panel import ID_ROLE  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)


def _texts(window) -> list[str]:
    view = window.library_panel.list
    return [view.item(row).text() for row in range(view.count())]


def _ids(window) -> list[int]:
    view = window.library_panel.list
    return [view.item(row).data(ID_ROLE) for row in range(view.count())]


def test_a_document_read_in_part_says_how_much_is_read(qtbot, home, tmp_path):
    """A stopped read's checkpoint (330 of 1,000 tokens) in the prefix store: its row says "read 33 %"
    and the header says the read goes on from there, not "not cached"."""
    from engine.prefix_store import PrefixStore, checkpoint_key
    from engine.workspace import prefix_store_dir
    from window_driver import notes_and_other

    window, notes_id, _other = notes_and_other(qtbot, tmp_path)
    notes = str(tmp_path / "notes.txt")
    window.library.upsert_document(path=notes, title="notes.txt", kind="text", tokens=1000, prefix_key="a" * 64)
    store = PrefixStore(prefix_store_dir(), disk_budget_bytes=1 << 30)
    store.put(checkpoint_key("a" * 64), {}, {}, n_tokens=330, label="notes.txt (read in part: 330 of 1,000 tokens)")
    window.refresh_cache_status()
    qtbot.waitUntil(lambda: window.cache_status is not None and not window.client.busy, timeout=30_000)
    row = next(text for text in _texts(window) if text.startswith("notes.txt"))
    assert "read 33 %" in row and "not cached" not in row
    window.state.show(window.library.document(notes_id))
    window.changed.emit(Changes(shown=True))
    assert "read 33 % before its read stopped" in window.header.info.text()
    other_row = next(text for text in _texts(window) if text.startswith("other.txt"))
    assert "not cached" in other_row  # never read: no share to give


def test_the_list_keeps_its_order_while_statuses_change_and_re_sorts_on_add(qtbot, home, tmp_path):
    """A status refresh (a read's progress, its cache saved) after a document's opened time moved
    keeps every row where it was, and the selection; adding a document re-sorts the list."""
    from engine.documents import load_document
    from window_driver import add_document, notes_and_other, pick

    window, notes_id, other_id = notes_and_other(qtbot, tmp_path)
    before = _ids(window)
    assert before == [notes_id, other_id]
    pick(window, other_id)
    time.sleep(0.01)
    window.library.upsert_document(path=str(tmp_path / "other.txt"), title="other.txt", kind="text", tokens=7)
    window.changed.emit(Changes(library=True))  # as refresh_cache_status does while a read goes on
    assert _ids(window) == before  # nothing moved under the mouse
    assert window.library_panel.list.currentItem().data(ID_ROLE) == other_id
    assert "7 tokens" in _texts(window)[1]  # the row was redrawn in place
    third = tmp_path / "third.txt"
    third.write_text("A third one.\n", encoding="utf-8")
    third_id = add_document(window, third, load_document(third))
    assert _ids(window) == [third_id, other_id, notes_id]  # an add re-sorts: most recently opened first


def test_opening_a_document_leaves_every_row_where_it_was(qtbot, home, tmp_path):
    """The trial: a double-clicked document jumped to the top the moment it opened, so the row
    under the pointer changed. Opening it (its opened time newest, the open one) redraws in place."""
    from window_driver import notes_and_other

    window, notes_id, other_id = notes_and_other(qtbot, tmp_path)
    before = _ids(window)
    assert before == [notes_id, other_id]
    time.sleep(0.01)
    window.library.upsert_document(path=str(tmp_path / "other.txt"), title="other.txt", kind="text", tokens=7)
    assert [r.id for r in window.library.documents()][0] == other_id  # the most recently opened now
    window.state.open_id = other_id  # as an open that finished sets it
    window.changed.emit(Changes(library=True, shown=True))
    assert _ids(window) == before, "the opened document moved under the pointer"
