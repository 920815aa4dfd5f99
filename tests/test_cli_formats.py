"""`halaman find` on a Word file in a real process (issue 41): the question names a section, and
the evidence selection finds it through the document's headings, as it does through a PDF's outline."""

from __future__ import annotations

import json

from test_cli import run


def make_study(path):
    import docx

    document = docx.Document()
    document.add_paragraph("Kestrel field study, 2024.")
    for number, (title, body) in enumerate([("Introduction", "Why we count kestrels. "),
                                            ("Methods", "We walked transects at dawn. "),
                                            ("Results", "We counted 41 nesting pairs on the moor. "),
                                            ("Discussion", "Voles were scarce this year. ")], start=1):
        document.add_heading(f"{number} {title}", 1)
        document.add_paragraph(body * 20)
    document.save(path)
    return path


def test_halaman_find_reads_a_docx_and_finds_the_section_a_question_names(tmp_path):
    path = make_study(tmp_path / "study.docx")
    out = run("find", str(path), "What is section 3 about?", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    assert rows[0]["label"] == "section 3 Results" and rows[0]["chosen"] and rows[0]["signal"] == "structure"
    assert {row["label"] for row in rows} <= {"start", "section 1 Introduction", "section 2 Methods",
                                               "section 3 Results", "section 4 Discussion"}
