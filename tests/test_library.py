"""The library's record of documents (engine.library, real SQLite, real files): whether a saved
reading still matches its file, files that are gone, and forgetting documents."""

from __future__ import annotations

import os
import shutil

from engine.library import CACHED, MISSING, STALE, Library
from engine.settings import EngineSettings


def recorded(library: Library, path) -> int:
    return library.upsert_document(path=str(path), title=path.name, kind="text", tokens=12, prefix_key="k1")


def test_a_file_changed_with_the_same_size_and_time_is_stale(tmp_path):
    """`cp -p` or a backup restore keeps size and modification time: it stayed "cached"."""
    doc, other = tmp_path / "minutes.txt", tmp_path / "restored.txt"
    doc.write_text("The board met on Tuesday; the crane lifts 40 tonnes.\n")
    other.write_text("The board met on Tuesday; the crane lifts 60 tonnes.\n")  # same size
    before = doc.stat()
    library = Library(tmp_path / "library.sqlite")
    try:
        record = library.document(recorded(library, doc))
        assert library.status(record, None, EngineSettings()) == CACHED
        shutil.copy2(other, doc)  # what cp -p does
        os.utime(doc, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (doc.stat().st_size, doc.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        assert library.status(record, None, EngineSettings()) == STALE
        # touching the file (ctime moves, content does not) keeps it cached
        os.utime(doc, ns=(before.st_atime_ns, before.st_mtime_ns))
        doc.chmod(0o644)
        assert library.status(library.document(recorded(library, doc)), None, EngineSettings()) == CACHED
    finally:
        library.close()


def test_a_signature_saved_before_content_hashes_still_reads_as_cached(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("hello\n")
    library = Library(tmp_path / "library.sqlite")
    try:
        doc_id = recorded(library, doc)
        st = doc.stat()
        library.db["documents"].update(doc_id, {"file_sig": f"file:{st.st_size}:{st.st_mtime_ns}"})
        library.db.conn.commit()
        assert library.status(library.document(doc_id), None, EngineSettings()) == CACHED
    finally:
        library.close()


def test_a_deleted_or_renamed_file_is_missing_and_can_be_removed(tmp_path):
    """It was "stale" forever, and nothing but the window could forget it."""
    library = Library(tmp_path / "library.sqlite")
    try:
        docs = {name: tmp_path / name for name in ("a.txt", "b.txt", "c.txt", "d.txt")}
        ids = {}
        for name, path in docs.items():
            path.write_text(f"document {name}\n")
            ids[name] = recorded(library, path)
        docs["a.txt"].unlink()
        docs["b.txt"].rename(tmp_path / "b-renamed.txt")
        status = {name: library.status(library.document(i), None, EngineSettings()) for name, i in ids.items()}
        assert status == {"a.txt": MISSING, "b.txt": MISSING, "c.txt": CACHED, "d.txt": CACHED}
        assert [r.title for r in library.remove()] == ["b.txt", "a.txt"]  # newest first
        assert [r.title for r in library.remove(str(docs["c.txt"]))] == ["c.txt"]  # by path
        assert [r.title for r in library.remove("d.txt")] == ["d.txt"]              # by title
        assert library.remove("nothing.txt") == [] and library.documents() == []
    finally:
        library.close()


def test_halaman_library_remove(tmp_path, monkeypatch, capsys):
    from engine.cli import main
    from engine.library import library_path

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    doc = tmp_path / "gone.txt"
    doc.write_text("soon gone\n")
    library = Library(library_path())
    recorded(library, doc)
    library.close()
    doc.unlink()
    assert main(["library", "list"]) == 0 and capsys.readouterr().out.startswith("missing ")
    assert main(["library", "remove", "--missing"]) == 0
    assert "removed gone.txt" in capsys.readouterr().out
    assert main(["library", "remove", "gone.txt"]) == 1
    assert "no document in the library has this path or title" in capsys.readouterr().err
