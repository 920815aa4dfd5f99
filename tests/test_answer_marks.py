"""Issue 44, item 1: the marks under an answer name the sentence they doubt and tell the direct
answer from a side remark; a yes/no answer the quoted passage contradicts is marked.

The answers are the embedded model's, from bench/answer_marks.py (docs/bench/answer_marks.json);
the passages are Halaman's text of the corpus pages they quote (CORNING_2022_10K page 60,
P16_thinkpython2 pages 181 and 189, NETFLIX_2017_10K page 42, AMERICANWATERWORKS_2022_10K page 82)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from engine.answer_marks import answer_marks, answer_sentences, direct_marks
from engine.evidence.yes_no import answer_polarity, asks_yes_no, contradiction
from engine.evidence_quotes import QuotedPassage

NETFLIX_ROW = QuotedPassage("page 42", "Revenues $ 11,692,713 $ 8,830,669 $ 6,779,511", 0.41)
ZIPF = QuotedPassage("page 181", "Zipf ’s law describes a relationship between the ranks and frequencies of words in "
                                 "natural languages", 0.5)
DBM = QuotedPassage("page 189", "A limitation of dbm is that the keys and values have to be strings or bytes.", 0.4)
# CORNING_2022_10K page 60, the balance sheet's current rows as Halaman reads them.
CORNING_BALANCE_SHEET = ("Table of Contents\nConsolidated Balance Sheets Corning Incorporated and Subsidiary Companies\n"
                         "December 31,\n(in millions, except share and per share amounts) 2022 2021\nAssets\nCurrent assets:\n"
                         "Cash and cash equivalents $ 1,671 $ 2,148\nTrade accounts receivable, net of doubtful accounts - "
                         "$40 and $42 1,721 2,004\nInventories (Note 5) 2,904 2,481\nOther current assets (Notes 10 and 14) "
                         "1,157 1,026\nTotal current assets 7,453 7,659\nProperty, plant and equipment, net of accumulated "
                         "depreciation\nOther accrued liabilities (Notes 10 and 13) 3,147 3,139\n"
                         "Total current liabilities 5,175 4,806\nLong-term debt (Note 11) 6,687 6,989")
CORNING_QUESTION = ("Does Corning have positive working capital based on FY2022 data? If working capital is not a "
                    "useful or relevant metric for this company, then please state that and explain why.")
ZIPF_ANSWER = ("The law of Zipf's Law describes a relationship between the ranks and frequencies of words in natural "
               "languages. It is named after the German mathematician Alfred Thomas Zippers, who first described it.")


def test_a_side_remark_names_something_invented_the_direct_answer_is_not_marked():
    marks = answer_marks(ZIPF_ANSWER, "Which law describes the relationship between the ranks and frequencies of words?",
                         [ZIPF], ["Alfred Thomas Zippers"])
    assert direct_marks(marks) == []
    [note] = marks
    assert note.kind == "name" and not note.direct and note.doubted == ("Alfred Thomas Zippers",)
    assert note.claim.startswith("It is named after the German mathematician Alfred Thomas Zippers")
    assert "a side remark names what the document nowhere says: “Alfred Thomas Zippers”" in note.note


def test_the_number_mark_names_the_sentence_of_the_direct_answer():
    answer = "Netflix's total revenues in 2017 were $3,285,755. Streaming grew in every region."
    [mark] = answer_marks(answer, "What were Netflix's total revenues in 2017?", [NETFLIX_ROW])
    assert mark.direct and mark.kind == "number" and mark.doubted == ("$3,285,755",)
    assert mark.claim == "Netflix's total revenues in 2017 were $3,285,755."
    assert mark.note.startswith("check the number: $3,285,755 is not in what the answer read most (page 42")
    assert "said in “Netflix's total revenues in 2017 were $3,285,755.”" in mark.note


def test_a_side_remarks_figure_from_elsewhere_in_the_document_is_no_mark():
    # The American Water Works answer (right: the company has negative working capital): its "5%"
    # is in the filing, not on the balance-sheet page it quotes; the grounding found every name.
    answer = ("No, American Water Works does not have positive working capital based on FY2022 data.\n"
              "The current ratio of 1:1 was set at 5% in 2021-2022, but it will be adjusted back down to 4% in 202")
    quoted = [QuotedPassage("page 82", "Table of Contents American Water Works Company, Inc. and Subsidiary Companies "
                                       "Consolidated Balance Sheets (In millions, except share and per share data) "
                                       "December 31, 2022 December 31, 2021 CAPITALIZATION AND LIABILITIES", 0.3)]
    assert answer_marks(answer, "Does American Water Works have positive working capital based on FY2022 data?", quoted) == []


def test_the_asked_figure_is_the_direct_answer_even_after_a_preamble():
    answer = ("The P&L statement and the statement of cash flows provide a detailed breakdown. The FY2015 depreciation "
              "and amortization margin for AMD is 3% ($46). Margins vary by year.")
    sentences = answer_sentences(answer, "what is the FY2015 depreciation and amortization % margin for AMD?")
    assert [s.direct for s in sentences] == [True, True, False]
    [mark] = answer_marks(answer, "what is the FY2015 depreciation and amortization % margin for AMD?", [NETFLIX_ROW])
    assert mark.claim.startswith("The FY2015 depreciation") and mark.direct
    # "as a percent of" names the subject of a question about a cause: no figure is asked for.
    cause = answer_sentences("It was deleveraging. It was $16 billion.", "What drove the reduction in SG&A expense as a percent of net sales?")
    assert [s.direct for s in cause] == [True, False]


def test_a_list_the_first_sentence_introduces_is_the_direct_answer_and_its_names_one_mark():
    answer = ("The primary customers of Boeing as of FY2022 are:\n1. US Airways (USA)\n2. Airbus A350-800\n"
              "3. Airbus A360-900\n\nThe U.S. Army buys it too. Airbus A350-G is another.")
    sentences = answer_sentences(answer)
    assert [s.text for s in sentences][:4] == ["The primary customers of Boeing as of FY2022 are:", "1. US Airways (USA)",
                                               "2. Airbus A350-800", "3. Airbus A360-900"]
    assert [s.direct for s in sentences] == [True, True, True, True, False, False]
    marks = answer_marks(answer, "Who are the primary customers of Boeing as of FY2022?", [],
                         ["A350-800", "A360-900", "A350-G"])
    assert [(m.direct, m.doubted) for m in marks] == [(True, ("A350-800", "A360-900")), (False, ("A350-G",))]
    assert marks[0].note == ("check the names: “A350-800”, “A360-900” are nowhere in the document — said in "
                             "“2. Airbus A350-800” and 1 more line")


def test_a_figure_the_number_mark_doubts_is_not_named_twice():
    answer = "The gain is $1.49 billion."
    marks = answer_marks(answer, "What is the amount of the gain?", [NETFLIX_ROW], ["1.49"])
    assert [m.kind for m in marks] == ["number"]


@pytest.mark.parametrize(("question", "expected"), [
    ("Does Corning have positive working capital?", True), ("Is Boeing's business subject to cyclicality?", True),
    ("Was there any drop in Cash & Cash equivalents?", True), ("What drove operating margin change?", False),
    ("How much has the effective tax rate changed?", False)])
def test_yes_no_questions(question, expected):
    assert asks_yes_no(question) is expected


def test_the_answers_polarity_is_plain_or_unclear():
    assert answer_polarity("No, Corning does not have positive working capital. It is fine.") == (
        False, "Corning does not have positive working capital.")
    assert answer_polarity("Yes, there was a slight decrease in cash.")[0] is True
    assert answer_polarity("Boeing's business is subject to cyclicality.")[0] is True
    assert answer_polarity("Yes, there was no drop in cash.")[0] is None     # yes to what? left alone
    assert answer_polarity("No, the company grew.")[0] is None


def test_a_no_that_the_quoted_balance_sheet_contradicts_is_marked():
    answer = "No, Corning does not have positive working capital based on FY2022 data. Working capital is a measure."
    found = contradiction(CORNING_QUESTION, answer, [("page 60", CORNING_BALANCE_SHEET)])
    assert found is not None and found.label == "page 60"
    assert "Total current assets 7,453" in found.evidence and "Total current liabilities 5,175" in found.evidence
    [mark] = answer_marks(answer, CORNING_QUESTION, [QuotedPassage("page 60", CORNING_BALANCE_SHEET, 0.4)])
    assert mark.kind == "yes/no" and mark.direct
    assert mark.note.startswith("check the yes/no: page 60 says otherwise: “Total current assets 7,453")
    # The right answer, and a balance sheet cut before its totals (nothing to decide), are not marked.
    assert contradiction(CORNING_QUESTION, "Yes, Corning has positive working capital.", [("page 60", CORNING_BALANCE_SHEET)]) is None
    assert contradiction(CORNING_QUESTION, answer, [("page 60", CORNING_BALANCE_SHEET[:240])]) is None


def test_a_negated_claim_against_the_quoted_sentence_is_marked_and_an_agreeing_one_not():
    question = "Do the keys and values of dbm have to be strings or bytes?"
    wrong = "No, the keys and values of dbm do not have to be strings or bytes."
    found = contradiction(question, wrong, [(DBM.label, DBM.text)])
    assert found is not None and found.evidence == DBM.text
    assert contradiction(question, "Yes, the keys and values of dbm have to be strings or bytes.", [(DBM.label, DBM.text)]) is None
    # A sentence sharing too few of the claim's words decides nothing.
    assert contradiction("Is Boeing's business subject to cyclicality?", "No, Boeing's business is not subject to cyclicality.",
                         [("page 8", "The airline industry has been cyclical and very competitive.")]) is None
    # Not a yes/no question: no check.
    assert contradiction("What limitation of dbm does pickle help with?", wrong, [(DBM.label, DBM.text)]) is None


def test_the_chat_shows_a_caution_on_the_direct_answer_and_a_note_on_the_side_remark(qtbot):
    pytest.importorskip("PySide6")
    import json

    from app.chat import ChatView, footer_text
    from engine.attended import AttendedSpan
    from engine.library import MessageRecord
    from engine.workspace import passages_json

    passages = [AttendedSpan(180, "page 181", 181, None, 0, 100, 0.5, quote=ZIPF.text)]
    question = MessageRecord(id=1, document_id=1, role="user", text="Which law describes the ranks and frequencies of words?",
                             state="done", created_s=0.0)
    answer = MessageRecord(id=2, document_id=1, role="assistant", text=ZIPF_ANSWER, state="done", created_s=0.0,
                           source="local", passages_json=passages_json(passages),
                           unsupported_json=json.dumps(["Alfred Thomas Zippers"]))
    chat = ChatView()
    qtbot.addWidget(chat)
    chat.show_messages([question, answer])
    shown = chat.toPlainText()
    assert "note: a side remark names what the document nowhere says: “Alfred Thomas Zippers” — said in “It is named" in shown
    assert "⚠" not in shown                                # the direct answer is not marked
    assert "nowhere says" not in footer_text(answer)       # said once, on its sentence
    wrong = MessageRecord(id=3, document_id=1, role="assistant", text="It is Benford's law. It is named after Frank Benford.",
                          state="done", created_s=0.0, source="local", passages_json=passages_json(passages),
                          unsupported_json=json.dumps(["Benford", "Frank Benford"]))
    chat.show_messages([question, wrong])
    assert "⚠ check the name: “Benford” is nowhere in the document — said in “It is Benford's law.”" in chat.toPlainText()


def test_a_reference_number_or_a_number_cut_by_the_quote_is_no_figure_the_evidence_holds():
    # FOOTLOCKER_2022_8K page 1 and AMD_2015_10K page 56 as quoted (cut at 240 characters): "13"
    # of "Section 13" and the "3" of a cut "$ 3,991" let "13 nominees" and "3%" through.
    cover = QuotedPassage("page 1", "UNITED STATES SECURITIES AND EXCHANGE COMMISSION WASHINGTON, D.C. 20549 FORM 8-K "
                                    "CURRENT REPORT Pursuant to Section 13 or 15(d) of the Securities Exchange Act of 1934", 0.3)
    [mark] = answer_marks("Yes, there were 13 nominees who voted against joining the Board of Directors.",
                          "Were there any board member nominees who had substantially more votes against joining?", [cover])
    assert mark.kind == "number" and mark.doubted == ("13",)
    amd = QuotedPassage("page 56", "ITEM 8. FINANCIAL STATEMENTS AND SUPPLEMENTARY DATA Advanced Micro Devices, Inc. "
                                   "Consolidated Statements of Operations Year Ended December 26, 2015 December 27, 2014 December 28, "
                                   "2013 (In millions, except per share amounts) Net revenue $ 3…", 0.2)
    [mark] = answer_marks("The FY2015 D&A margin for AMD is 3% ($46).", "what is the FY2015 D&A % margin for AMD?", [amd])
    assert mark.doubted == ("3%",)


def test_a_code_name_the_direct_answer_gives_that_the_quoted_passage_does_not_hold_is_marked():
    # P16_thinkpython2 page 93: the Ackermann exercise; the answer named another exercise's function.
    exercise = QuotedPassage("page 93", "Exercise 6.2. The Ackermann function, A(m, n), is defined: A(m, n) = n + 1 if m = 0 "
                                        "A(m − 1, 1) if m > 0 and n = 0. Write a function named ack that evaluates the "
                                        "Ackermann function.", 0.4)
    question = "What is the name of the function that the Ackermann exercise asks you to write?"
    [mark] = answer_marks("The function that the exercise asks to write is called `is_power` and it uses a dictionary.",
                          question, [exercise])
    assert mark.kind == "name" and mark.direct and mark.doubted == ("is_power",)
    assert mark.note.startswith("check the name: “is_power” is not in what the answer read most (page 93")
    # The right name, a web address and the question's own names are no such mark.
    assert answer_marks("The function is called `ack`.", question, [exercise]) == []
    assert answer_marks("It suggests the website gutenberg.org.", "Which website does it suggest?", [exercise]) == []
    kangaroo = QuotedPassage("page 224", "An __init__ method that initializes an attribute named pouch_contents to an empty list.", 0.5)
    assert answer_marks("The attribute is called pouch_contents.", "What attribute does __init__ initialize?", [kangaroo]) == []


def test_a_years_figure_answered_with_one_quarters_is_marked_with_the_years_sum(corpus):
    """The trial: "What were Netflix's total revenues in 2017?" → "$3,285,755", the fourth
    quarter's, from the quarterly table the answer quoted (page 63), so the number was "held". The
    row holds four amounts, a quarterly table's shape; they add up to the year's 11,692,713 (page 42).
    The year's own row (three years), or a question about a quarter, is no mark."""
    from engine.documents import load_document

    netflix = load_document(corpus / "financebench-dev" / "pdfs" / "NETFLIX_2017_10K.pdf")
    quarterly, annual = netflix.segments[62].text, netflix.segments[41].text
    start = quarterly.index("Total revenues $ 3,285,755")
    row = QuotedPassage("page 63", quarterly[start:start + 240], 0.06)
    question = "What were Netflix's total revenues in 2017?"
    marks = answer_marks("Netflix's total revenues in 2017 were $3,285,755.", question, [row])
    assert [m.kind for m in marks] == ["number"] and marks[0].direct, marks
    assert "$3,285,755 is one of four figures" in marks[0].note and "add up to 11,692,713" in marks[0].note
    assert "11,692,713" in annual  # the sum is the year's figure the statement of operations states
    year = annual.index("11,692,713")
    year_row = QuotedPassage("page 42", annual[max(0, year - 40):year + 200], 0.5)
    assert answer_marks("Netflix's total revenues in 2017 were $11,692,713.", question, [year_row]) == []
    assert answer_marks("They were $3,285,755.", "What were Netflix's revenues in the fourth quarter of 2017?", [row]) == []
