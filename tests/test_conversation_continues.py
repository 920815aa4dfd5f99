"""Issue 44, item 2: the engine decides whether a question goes on from the previous one, so a
conversation needs no box: pronouns and openings that refer back continue it, a part of the
document named through its structure or a question about the whole starts afresh."""

from __future__ import annotations

import pytest

from engine.documents import load_document
from engine.evidence.conversation import continuation
from engine.evidence.structure import DocumentStructure


@pytest.fixture(scope="module")
def book(corpus):
    return DocumentStructure.of(load_document(corpus / "pdf" / "P16_thinkpython2.pdf"))


CONTINUES = [
    ("What is chapter 5 about?", "What examples does it use?"),  # the window trial's question
    ("What does the book call a function that returns a value?", "And what is one called that always returns None?"),
    ("Which built-in type maps keys to values?", "What is one key together with its value called?"),
    ("Which function do I call to send a POST request?", "Which function does it call to do the work?"),
    ("What is a tuple?", "Why?"),
    ("What is recursion?", "Any examples?"),
    ("Who was Euclid?", "What did he prove?"),
]
AFRESH = [
    ("What is chapter 5 about?", "What is chapter 15 about?"),       # names another chapter: even with "it"
    ("What examples does it use?", "What does chapter 8 say about it?"),
    ("What is chapter 5 about?", "Who is this book written for?"),   # about the whole book
    ("What is chapter 5 about?", "Which chapter of the book is about files?"),
    ("What is chapter 5 about?", "How can a program keep repeating some statements as long as a condition stays true?"),
    ("What is a tuple?", "Summarize the chapter on strings in two sentences."),
]


@pytest.mark.parametrize(("previous", "question"), CONTINUES)
def test_a_question_that_refers_back_continues(book, previous, question):
    assert continuation(question, previous, book) is not None


@pytest.mark.parametrize(("previous", "question"), AFRESH)
def test_a_question_that_names_its_own_subject_starts_afresh(book, previous, question):
    assert continuation(question, previous, book) is None


def test_the_first_question_continues_nothing_and_says_why_it_continues(book):
    assert continuation("What examples does it use?", None, book) is None
    assert continuation("What examples does it use?", "", book) is None
    assert "it" in continuation("What examples does it use?", "What is chapter 5 about?", book)


def test_a_question_that_refers_back_reads_the_previous_questions_pages_with_nothing_ticked(smol, corpus):
    """The window trial: "What examples does it use?" after "What is chapter 5 about?", with no
    Follow-up box ticked, read chapter 15. Asked with `follow_up=None` (what the window sends
    unticked), it goes on: it reads chapter 5's pages again and says why; a question naming
    another chapter starts afresh."""
    from engine.session import DocumentSession
    from engine.settings import EngineSettings

    session = DocumentSession(smol, EngineSettings(max_new_tokens=4), None)
    session.open(load_document(corpus / "pdf" / "P16_thinkpython2.pdf"), read_now=False)
    try:
        first = session.ask("What is chapter 5 about?", follow_up=None)
        chapter_5 = set(first.recall.spans)
        assert chapter_5 and first.continues == ""
        examples = session.ask("What examples does it use?", follow_up=None)
        assert "it" in examples.continues
        assert chapter_5 <= set(examples.recall.spans), (chapter_5, examples.recall.spans)
        other = session.ask("What is chapter 15 about?", follow_up=None)
        assert other.continues == "" and not chapter_5 & set(other.recall.spans)
    finally:
        session.close()
