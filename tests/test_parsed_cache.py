"""A file's parse kept for the next time (engine.documents.parsed_cache): the same `Document`, not
parsed again while the file's bytes and the readers are the same."""

from __future__ import annotations

import shutil

import pytest

from engine.documents import load_document, parsed_cache
from engine.documents.parsed_cache import load_reusing


@pytest.fixture
def parses(monkeypatch, tmp_path):
    """The real `load_document`, counted; a cache folder of this test's own."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    calls = []
    real = parsed_cache.load_document

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(parsed_cache, "load_document", counted)
    return calls


def test_a_pdf_is_parsed_once_and_comes_back_the_same(corpus, tmp_path, parses):
    pdf = tmp_path / "P05_dmca.pdf"
    shutil.copy(corpus / "pdf" / "P05_dmca.pdf", pdf)
    first = load_reusing(pdf)
    heard = []
    again = load_reusing(pdf, progress=lambda done, total: heard.append((done, total)))
    assert len(parses) == 1 and heard == [(1, 1)]
    assert again == first == load_document(pdf)
    assert again.segments[3].text == first.segments[3].text and again.outline == first.outline


def test_a_changed_file_a_damaged_entry_and_a_password_parse_again(tmp_path, parses):
    notes = tmp_path / "notes.txt"
    notes.write_text("The code word is PELICAN.\n")
    assert "PELICAN" in load_reusing(notes).segments[0].text
    notes.write_text("The code word is HERON.\n")  # same name, new bytes
    assert "HERON" in load_reusing(notes).segments[0].text and len(parses) == 2
    for entry in (tmp_path / "home" / "cache" / "parsed").iterdir():
        entry.write_text("{not json")
    assert "HERON" in load_reusing(notes).segments[0].text and len(parses) == 3
    copy = tmp_path / "other.txt"
    shutil.copy(notes, copy)  # the same bytes under another name: labelled by its own name
    assert load_reusing(copy).segments[0].label == "other.txt" and len(parses) == 4
    kept = set((tmp_path / "home" / "cache" / "parsed").iterdir())
    load_reusing(notes, password="secret")
    assert set((tmp_path / "home" / "cache" / "parsed").iterdir()) == kept, "a password's text is never kept"


def test_a_folder_is_read_each_time(tmp_path, parses):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "app.py").write_text("def main():\n    return 42\n")
    load_reusing(folder)
    load_reusing(folder)
    assert len(parses) == 2


def test_clearing_the_cache_deletes_the_parsed_copies(tmp_path, parses):
    from engine.settings import EngineSettings
    from engine.workspace import Workspace

    notes = tmp_path / "notes.txt"
    notes.write_text("The code word is PELICAN.\n")
    load_reusing(notes)
    folder = tmp_path / "home" / "cache" / "parsed"
    assert len(list(folder.glob("*.json"))) == 1
    Workspace(EngineSettings()).clear_prefix_cache()  # no model needed to clear
    assert list(folder.glob("*.json")) == []
    load_reusing(notes)
    assert len(parses) == 2, "parsed again after the clear"
