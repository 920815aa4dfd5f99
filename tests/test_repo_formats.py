"""Office documents, decks and e-books inside a folder opened as a repository or library are read
by their formats' readers (engine.documents.formats), not skipped as binary; CSV stays text, and a
damaged one is skipped with its reason. Files made in the test with the formats' own libraries."""

from __future__ import annotations

from engine.documents.repo import load_repository
from format_files import make_docx, make_epub, make_pptx


def test_word_files_decks_and_e_books_in_a_folder_are_read_with_their_units(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('kestrel')\n", encoding="utf-8")
    (tmp_path / "data.csv").write_text("region,revenue\nNorth,1200\n", encoding="utf-8")
    make_docx(tmp_path / "docs" / "report.docx")
    make_pptx(tmp_path / "docs" / "quarterly.pptx")
    make_epub(tmp_path / "docs" / "guide.epub", [("Field guide", "<h1>Field guide</h1><p>The kestrel hovers.</p>")])
    (tmp_path / "docs" / "broken.docx").write_bytes(b"PK\x03\x04 not really a zip")
    document = load_repository(tmp_path, use_git=False)
    files = {segment.label: segment.text for segment in document.segments}
    assert set(files) == {"src/main.py", "data.csv", "docs/report.docx", "docs/quarterly.pptx", "docs/guide.epub"}
    report = files["docs/report.docx"]
    assert "Annual report of the Kestrel company" in report and "The kestrel hovers over the meadow." in report
    assert "North" in report and "1200" in report and "Second page text." in report
    deck = files["docs/quarterly.pptx"]
    assert "[slide 1]" in deck and "[slide 2]" in deck and deck.index("Quarterly results") < deck.index("Sales by region")
    assert "Mention the kestrel deal" in deck  # speaker notes, as the deck's own reader gives them
    assert "The kestrel hovers." in files["docs/guide.epub"]
    assert files["data.csv"].strip() == "region,revenue\nNorth,1200"  # a table file in a folder stays its text
    assert any("docs/broken.docx" in warning and "unreadable" in warning for warning in document.warnings), document.warnings
