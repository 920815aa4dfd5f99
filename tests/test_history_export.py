"""Exporting a conversation (issue 32): File › Export in the window and `halaman history export
PATH` write the same Markdown, every citation as "[document, page N]" naming a page that exists,
the attended sentence quoted; a citation the document does not have is never written as one."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import re  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.export_flow import export_conversation  # noqa: E402
from engine.attended import AttendedSpan  # noqa: E402
from engine.cli import main as cli_main  # noqa: E402
from engine.documents import load_document  # noqa: E402
from pdf_fixtures import helvetica_book  # noqa: E402
from test_app import home, pick  # noqa: E402,F401  (fixture)
from window_driver import add_document, stream_answer, window_without_model  # noqa: E402

RIVER = "The river in the atlas is green."
REFERENCE = re.compile(r"\[([^\[\],]+), ([^\[\]]+)\]")


def test_every_citation_of_an_exported_conversation_names_a_page_that_exists(qtbot, home, tmp_path, capsys):
    pdf = helvetica_book(tmp_path / "atlas.pdf", [["The atlas opens here."], ["Its second page.", RIVER], ["Page three."]])
    document = load_document(pdf)
    labels = {segment.label for segment in document.segments}
    window = window_without_model(qtbot)
    assert window.action_export in window.menuBar().actions()[0].menu().actions()
    document_id = add_document(window, pdf.resolve(), document)
    pick(window, document_id)
    start = document.segments[1].text.index(RIVER)
    stream_answer(qtbot, window, document_id, "What colour is the river?",
                  "It is green [page 2]; the atlas is short [pages 1-3]. Not [p. 9], and `[page 7]` is code.",
                  passages=[AttendedSpan(1, "page 2", 2, None, start, start + len(RIVER), 0.8)])
    stream_answer(qtbot, window, document_id, "Anything else?", "Nothing else [page 3].", mean_logprob=-5.0)

    written = export_conversation(window, str(tmp_path / "atlas.md"))
    text = written.read_text(encoding="utf-8")
    references = REFERENCE.findall(text)
    assert references, text
    assert all(name == document.title and label in labels for name, label in references), references
    title = document.title
    assert (f"It is green [{title}, page 2]; the atlas is short [{title}, page 1], [{title}, page 2], "
            f"[{title}, page 3]. Not (cites “p. 9”, which is not in the document), and `[page 7]` is code.") in text
    assert f"> “{RIVER}” — [{title}, page 2] (80 %)" in text
    assert "**Question:** What colour is the river?" in text and "low confidence" in text
    assert text.index("What colour") < text.index(RIVER) < text.index("Anything else?")

    # The command line writes the same record (the window's history is the CLI's).
    assert cli_main(["history", "export", str(pdf)]) == 0
    printed = capsys.readouterr().out
    assert REFERENCE.findall(printed) == references
    assert printed.splitlines()[3:] == text.splitlines()[3:]  # all but the time of export
    assert cli_main(["history", "export", str(tmp_path / "never-opened.pdf")]) != 0
    window.close()


def test_a_single_file_is_cited_by_its_name_once_not_as_name_comma_name(home, tmp_path, capsys):
    # Issue 32: a text file's one segment is labelled with its name, which is also the document's
    # title, so the export wrote "[kv-cache-primer.md, kv-cache-primer.md]".
    from engine.library import Library
    from engine.workspace import passages_json

    note = tmp_path / "kv-cache-primer.md"
    sentence = "The prefix cache keeps a document's keys and values on disk."
    note.write_text(f"# KV cache primer\n\n{sentence}\n", encoding="utf-8")
    document = load_document(note)
    [segment] = document.segments
    assert segment.label == document.title == "kv-cache-primer.md"
    library = Library(interrupt_streaming=False)
    document_id = library.upsert_document(path=str(note.resolve()), title=document.title, kind=document.kind, tokens=30)
    library.add_message(document_id, "user", "What does the prefix cache keep?")
    start = segment.text.index(sentence)
    library.add_message(document_id, "assistant", "Keys and values [kv-cache-primer.md].", model="SmolLM2",
                        passages_json=passages_json([AttendedSpan(0, segment.label, None, None, start,
                                                                  start + len(sentence), 0.9)]))
    library.close()

    assert cli_main(["history", "export", str(note)]) == 0
    text = capsys.readouterr().out
    assert "Keys and values [kv-cache-primer.md]." in text
    assert f"> “{sentence}” — [kv-cache-primer.md] (90 %)" in text
    assert "kv-cache-primer.md, kv-cache-primer.md" not in text


def test_the_suggested_export_name_keeps_a_folder_s_version_and_drops_a_file_s_suffix(tmp_path):
    """The trial: the code folder requests-2.34.2 was offered as "requests-2.34 (conversation).md"."""
    from app.export_flow import export_name

    folder = tmp_path / "requests-2.34.2"
    folder.mkdir()
    assert export_name(str(folder)) == "requests-2.34.2"
    assert export_name(str(tmp_path / "book.pdf")) == "book"
    assert export_name(str(tmp_path / "notes.v2.md")) == "notes.v2"
