"""Names an answer states that its document does not contain (engine.grounding): on real
documents of the corpus with answers the embedded model really gave (docs/bench/doc_qa_evidence.json
and the window trial), through the library, the window's footer, the export and `halaman ask`."""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.grounding import DocumentWords, answer_names, unsupported_note

REPO = Path(__file__).resolve().parent.parent


def test_names_are_what_a_reader_could_look_up_and_not_plain_words():
    answer = ('The `send_post` function calls self._create_response() and HTTPAdapter with pool_size 10 '
              'under the "All rights reserved" notice, written by Allen Downey. The licence is CC BY-NC-SA. '
              'It is short and simple.')
    names = answer_names(answer)
    for name in ["send_post", "self._create_response()", "HTTPAdapter", "pool_size", "10", "All rights reserved",
                 "Allen Downey", "BY-NC-SA"]:
        assert name in names
    # Sentence-initial capitals, single digits and plain words are not names.
    assert not {"The", "It", "short", "simple", "licence"} & set(names)
    assert answer_names("Yes, 3 of them.") == []


def test_a_name_is_supported_by_the_document_or_the_question_whatever_its_case_or_line_breaks():
    words = DocumentWords("Copyright 2015 Allen\nDowney. Green Tea Press.\n def parse_header_links(value):")
    assert words.unsupported("It was written by Allen Downey at Green Tea Press.") == []
    assert words.unsupported("Use `parse_header_links()` from 2015.") == []
    assert words.unsupported("It is published by O'Reilly Media.") == ["Media"]  # "O'Reilly" starts no name: capital after a quote
    assert words.unsupported("The function is `fetch_links`.") == ["fetch_links"]
    assert words.unsupported("The function is `fetch_links`.", question="What does fetch_links do?") == []
    # A phrase is found when each of its longer words is, in any order (a paraphrased title).
    assert words.unsupported('The publisher is "Press Green Tea".') == []
    assert words.unsupported('The notice reads "All rights reserved".') == ["All rights reserved"]


def test_the_book_s_invented_notices_and_names_are_marked_and_its_own_are_not(corpus):
    from engine.documents import load_document

    words = DocumentWords(load_document(corpus / "pdf" / "P16_thinkpython2.pdf").render())
    # The window trial's answer to "What is the copyright notice?" (page 4 gives a Creative Commons licence).
    assert words.unsupported('The copyright notice is "Copyright © 2015 Allen Downey. All rights reserved."') == [
        "Copyright © 2015 Allen Downey. All rights reserved."]  # the quotation as a whole: its last words are not the book's
    # This session's answer to the same question: the licence code it quotes is not the book's.
    assert words.unsupported("under the terms of the Creative Commons Attribution-NonCommercial 3.0 International\n"
                             "License (CC BY-NC-BY).") == ["BY-NC-BY"]
    assert words.unsupported("It is named after Alfred Thomas Zipf.") == ["Alfred Thomas Zipf"]
    # Right answers the model gave (docs/bench/doc_qa_evidence.json): nothing to check.
    for right in ["The Moby lexicon word list contains 113,809 words.",
                  "The mathematician Srinivasa Ramanujan found the infinite series used in the estimate_pi exercise.",
                  'The title of chapter 7 is "Iteration."',
                  "The book was published by Green Tea Press."]:
        assert words.unsupported(right) == [], right


def test_code_answers_that_invent_functions_are_marked(corpus):
    from engine.documents import load_document

    words = DocumentWords(load_document(corpus / "repos" / "requests-2.34.2").render())
    assert words.unsupported("You can use the `send_post` function. It is called by the `self._create_response()` "
                             "method.") == ["send_post", "self._create_response()"]
    assert words.unsupported("The exception `TooManyRedirects` is raised after 30 redirects.") == []


def test_the_library_keeps_the_names_and_the_footer_and_export_say_them_escaped(tmp_path):
    from app.chat import evidence_lines, footer_text
    from engine.history import answered_by
    from engine.library import Library

    library = Library(tmp_path / "library.sqlite")
    document_id = library.upsert_document(path=str(tmp_path / "book.pdf"), title="book", kind="pdf", pages=3)
    names = ["send_post", "<img src=x>"]
    message_id = library.add_message(document_id, "assistant", "Call send_post.", source="local",
                                     unsupported_json=json.dumps(names))
    library.close()
    stored = Library(tmp_path / "library.sqlite").message(message_id)
    assert stored.unsupported == names
    note = "check this answer: " + unsupported_note(names)
    assert note in answered_by(stored)
    assert "“send_post”" in note
    # The window marks them on their sentence (app.chat.evidence_lines), escaped, not in the footer.
    direct, elsewhere = evidence_lines(stored)
    assert "check the name: “send_post” is nowhere in the document — said in “Call send_post.”" in direct
    assert "“&lt;img src=x&gt;”" in elsewhere and "nowhere" not in footer_text(stored)
    broken = Library(tmp_path / "library.sqlite")
    broken.db.execute("UPDATE messages SET unsupported_json = '{\"a\": 1}' WHERE id = ?", [message_id])
    assert broken.message(message_id).unsupported == []  # a damaged column is no names, not a crash


def test_the_chat_shows_a_name_written_as_markup_as_its_characters(qtbot):
    from app.chat import ChatView
    from engine.library import MessageRecord

    view = ChatView()
    qtbot.addWidget(view)
    record = MessageRecord(1, 1, "assistant", "An answer.", "done", 0.0, source="local", model="SmolLM2",
                           unsupported_json=json.dumps(["<b>bold</b>"]))
    view.show_messages([record])
    text = view.toPlainText()
    assert "“<b>bold</b>”" in text


def test_ask_says_which_names_the_document_does_not_contain(tmp_path):
    # The embedded model, asked for something the note does not say, makes an address up: the
    # report's "check" line lists exactly what the check finds in the printed answer.
    doc = tmp_path / "note.md"
    doc.write_text("# Meeting notes\n\nThe budget review meeting is on Tuesday at 10 in room 4.\nAnna presents the travel costs.\n")
    question = "Who wrote these notes and what is their email address?"
    halaman = Path(sys.executable).parent / "halaman"
    command = [str(halaman)] if halaman.exists() else [sys.executable, "-m", "engine.cli"]
    out = subprocess.run([*command, "ask", str(doc), question, "--max-new-tokens", "40", "--no-history"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ), cwd=REPO)
    assert out.returncode == 0, out.stderr
    answer = out.stdout.split("\n--- report ---")[0].strip()
    from engine.documents import load_document

    expected = DocumentWords(load_document(doc).render()).unsupported(answer, question)
    assert expected, f"the model's answer named nothing the note lacks: {answer!r}"
    checks = [line for line in out.stdout.splitlines() if line.startswith("check ")]
    assert any(line.endswith(unsupported_note(expected)) for line in checks), (answer, checks)


def test_a_citation_of_a_page_the_answer_did_not_read_says_so_in_the_window_and_the_export(tmp_path):
    """The trial: asked for the copyright notice, the model read page 4 and cited "[page 12]" (the
    contributors list); the citation looked as sound as any. It now says it is not among the pages
    the answer read, in the Cited line and in the export; an answer over a document kept whole
    (no spans recorded: it read everything) marks nothing."""
    from app.chat import sources_line
    from engine.documents import load_document
    from engine.history import UNREAD_CITATION, cite, conversation_markdown
    from engine.library import Library, MessageRecord

    read = json.dumps({"spans": ["page 4", "page 5 (characters 0–1,200)"], "tokens_recalled": 90})
    sources = json.dumps([{"label": "page 4", "share": 0.8, "page": 4, "path": None}])
    text = "The notice is on [page 4] and [page 12]."
    record = MessageRecord(1, 1, "assistant", text, "done", 0.0, source="local", recall_json=read, sources_json=sources)
    assert record.read_labels == {"page 4", "page 5"}
    line = sources_line(text, {"page 4", "page 5", "page 12"}, 1, record.read_labels)
    assert line.count(UNREAD_CITATION) == 1 and line.index("page 12") < line.index(UNREAD_CITATION)
    whole = MessageRecord(1, 1, "assistant", text, "done", 0.0, source="local", recall_json=json.dumps({"off": "kept whole"}))
    assert whole.read_labels is None and UNREAD_CITATION not in sources_line(text, {"page 4", "page 12"}, 1, whole.read_labels)
    exported = cite(text, "book", {"page 4", "page 12"}, record.read_labels)
    assert exported == f"The notice is on [book, page 4] and [book, page 12] ({UNREAD_CITATION})."

    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday.\n")
    library = Library(tmp_path / "library.sqlite")
    document_id = library.upsert_document(path=str(doc), title="notes.md", kind="text")
    library.add_message(document_id, "user", "Show the code")
    cut = "Here:\n```python\ndef meeting():\n    return 'Tuesday'"  # cut at the length limit inside the block
    library.add_message(document_id, "assistant", cut, source="local", stop_reason="max_tokens")
    markdown = conversation_markdown(library.document(document_id), library.messages(document_id), load_document(doc))
    assert sum(line.startswith("```") for line in markdown.splitlines()) % 2 == 0, markdown


def test_the_window_footer_and_the_export_carry_the_instruction_caution(tmp_path):
    """Issue 45.5 in the window: a stored answer to a document that addresses the model says so
    under the answer, local or cloud (schema 6 keeps the phrases)."""
    from app.chat import footer_text
    from engine.answer import Answer, StopReason
    from engine.grounding import instructions_note
    from engine.library import Library
    from engine.workspace import answer_record

    phrases = ["Ignore all previous instructions"]
    answer = Answer("Is it cancelled?", "Yes, the contract is cancelled.", [1, 2], 10, 0.1, 5.0, False,
                    StopReason.END, -0.4, instructions=phrases)
    library = Library(tmp_path / "library.sqlite")
    document_id = library.upsert_document(path=str(tmp_path / "lease.txt"), title="lease.txt", kind="text")
    message_id = library.add_message(document_id, "assistant", answer.text,
                                     **{k: v for k, v in answer_record(answer, model=None, recall=None).fields().items()
                                        if k not in ("text", "state")})
    library.close()
    stored = Library(tmp_path / "library.sqlite").message(message_id)
    assert stored.instructions == phrases
    # A text with no source recorded: checked against "the document" (a PDF's page: "the page").
    assert "check this answer: " + instructions_note(phrases, "the document") in footer_text(stored)
    from engine.history import answered_by

    assert "check this answer: " + instructions_note(phrases, "the document") in answered_by(stored)  # the exported history too
