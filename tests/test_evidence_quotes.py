"""Issue 44, item 1: under each answer, what it attended to most, quoted with its page, and a
caution when the answer's number is not in it (the window trial's Netflix and Foot Locker answers
took a number from another cell, with no mark: the grounding check found the numbers in the document)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from engine.attended import AttendedSpan, attended_spans  # noqa: E402
from engine.documents import Document, Segment  # noqa: E402
from engine.evidence_quotes import QuotedPassage, number_caution, numbers_in, quoted_passages  # noqa: E402

# The rows and sentences as Halaman reads them from the filings (NETFLIX_2017_10K page 42,
# FOOTLOCKER_2022_8K page 2).
NETFLIX_ROW = QuotedPassage("page 42", "Revenues $ 11,692,713 $ 8,830,669 $ 6,779,511", 0.41)
NETFLIX_HEADER = QuotedPassage("page 42", "2017 2016 2015", 0.12)
FOOTLOCKER = QuotedPassage("page 2", "As of March 21, 2022, the Company’s record date for the Annual Meeting, there were a "
                                     "total of 96,089,997 shares of common stock, $0.01 par value per share (“Common Stock”), "
                                     "outstanding and entitled to vote", 0.55)


def test_a_number_from_another_cell_is_marked():
    caution = number_caution("Netflix's total revenues in 2017 were $3,285,755.",
                             "What were Netflix's total revenues in 2017?", [NETFLIX_ROW, NETFLIX_HEADER])
    assert caution is not None and "3,285,755" in caution and "page 42" in caution
    caution = number_caution("There were 96,076,265 shares outstanding.",
                             "How many shares of common stock were outstanding on the record date?", [FOOTLOCKER])
    assert caution is not None and "96,076,265" in caution


def test_a_number_the_evidence_holds_is_not_marked():
    assert number_caution("Netflix's total revenues in 2017 were $11,692,713 thousand.",
                          "What were Netflix's total revenues in 2017?", [NETFLIX_ROW, NETFLIX_HEADER]) is None
    assert number_caution("96,089,997 shares were outstanding.", "How many shares?", [FOOTLOCKER]) is None


@pytest.mark.parametrize(("answer", "quoted"), [
    ("The book was written in 2015 for beginners.", [FOOTLOCKER]),                         # a year is no figure to check
    ("Revenue grew in every quarter of 2016.", [NETFLIX_ROW]),                              # no figure stated
    ("The 3 largest customers are:\n1. Delta\n2. United", [NETFLIX_ROW]),                 # a count under 10 and list items
    ("It builds the A350 and the F-35C.", [NETFLIX_ROW]),                                   # model names, not figures
    ("There were 96,076,265 shares.", [QuotedPassage("page 2", "Shareholders voted on four proposals.", 0.5)]),  # prose: nothing to compare
    ("There were 96,076,265 shares.", []),                                                  # nothing quoted
])
def test_no_caution_where_there_is_nothing_to_compare(answer, quoted):
    assert number_caution(answer, "How many?", quoted) is None


def test_percentages_amounts_and_short_figures_are_checked_too():
    # bench/answer_marks.py's wrong answers that the 4-digit rule let through: a ratio, a tax rate,
    # a count, an amount in billions, none of them in the row the answer read most.
    assert "32%" in number_caution("Revenue grew 32% over 2016.", "How much did revenue grow?", [NETFLIX_ROW])
    assert "3.5%" in number_caution("The FY2017 operating cash flow ratio is 3.5%.", "What is the ratio?", [NETFLIX_ROW])
    assert "$1.4" in number_caution("The cash proceeds were $1.4 billion.", "How much?", [NETFLIX_ROW])
    assert "12" in number_caution("It opened 12 new stores [page 42].", "How many stores?", [NETFLIX_ROW])
    assert number_caution("It opened 12 new stores [page 42].", "How many stores?", [NETFLIX_ROW]).startswith(
        "check the number: 12 is not")
    assert number_caution("Revenues were $ 8,830,669 in 2016.", "What were revenues?", [NETFLIX_ROW]) is None


def test_the_questions_own_numbers_are_not_the_answers():
    assert number_caution("Order 48213 ships on Monday.", "When does order 48213 ship?",
                          [QuotedPassage("page 1", "Order 55102 ships on Friday, order 1234.5 too.", 0.9)]) is None
    assert numbers_in("$ 11,692,713 and 3.14159 in 2017, 12500 items, 1 234 567") == ["11,692,713", "3.14159", "12500", "1 234 567"]


def test_attended_passages_carry_their_quote_and_the_two_strongest_are_quoted():
    text = "Revenue was flat. Revenues $ 11,692,713 rose.\nCosts fell by 3 %."
    document = Document("t", "/t.pdf", "pdf", [Segment(text=text, label="page 1", page=1, path=None)], pages=1)
    chars = list(range(len(text)))
    mass = [0.0] * len(text)
    for i in range(text.index("Revenues"), text.index("rose.") + 5):
        mass[i] = 1.0
    for i in range(0, 17):
        mass[i] = 0.4
    spans = attended_spans(mass, chars, 0, document)
    assert spans[0].quote == "Revenues $ 11,692,713 rose."
    quoted = quoted_passages(spans + [AttendedSpan(0, "page 9", 9, None, 0, 3, 0.99)])  # no quote: old record
    assert [q.text for q in quoted] == ["Revenues $ 11,692,713 rose.", "Revenue was flat."]


def test_the_chat_shows_the_evidence_under_a_stored_answer_with_its_caution(qtbot):
    pytest.importorskip("PySide6")
    from app.chat import ChatView
    from engine.library import MessageRecord
    from engine.workspace import passages_json

    passages = [AttendedSpan(41, "page 42", 42, None, 0, 45, 0.41, quote=NETFLIX_ROW.text),
                AttendedSpan(41, "page 42", 42, None, 46, 60, 0.12, quote=NETFLIX_HEADER.text)]
    question = MessageRecord(id=1, document_id=1, role="user", text="What were Netflix's total revenues in 2017?", state="done", created_s=0.0)
    answer = MessageRecord(id=2, document_id=1, role="assistant", text="They were $3,285,755 [page 42].",
                           state="done", created_s=0.0, source="local", passages_json=passages_json(passages))
    chat = ChatView()
    qtbot.addWidget(chat)
    chat.show_messages([question, answer])
    shown = chat.toPlainText()
    assert "“Revenues $ 11,692,713 $ 8,830,669 $ 6,779,511” — page 42 (41%)" in shown
    assert "check the number: $3,285,755 is not in what the answer read most" in shown
    right = MessageRecord(id=3, document_id=1, role="assistant", text="They were $11,692,713 thousand [page 42].",
                          state="done", created_s=0.0, source="local", passages_json=passages_json(passages))
    chat.show_messages([question, right])
    assert "page 42 (41%)" in chat.toPlainText() and "check the number" not in chat.toPlainText()
