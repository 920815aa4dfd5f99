"""`halaman find` without the model: the spans a question would read, from the document's parsed
copy, the model's tokenizer alone and the selection (`engine.evidence.select`).

    result = find_spans("book.pdf", "What examples does it use?", settings, after=["What is chapter 5 about?"])
    result.rows        # FoundSpan rows, best first (the chosen ones marked)
    result.continues   # "refers back: “it”": it goes on from the last question ("" : a new one)

The rows are those the open session's selection gives with the model loaded (the same token
counts: the tokenizer is the model's, `engine.tokenizer_cache`), without loading, converting or
de-quantizing any weights, and without importing torch: a 288-page book's `find` went from 12–73 s
to a few seconds (issue 42). The document is parsed once (`engine.documents.parsed_cache`); its
token offsets and full-text index are kept too (`engine.evidence.kept_spans`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.documents import Document, ProgressCallback
from engine.documents.parsed_cache import load_reusing
from engine.errors import HalamanError
from engine.evidence.conversation import select_after
from engine.evidence.kept_spans import Encoded, kept_spans
from engine.evidence.reading_budget import reading_budget
from engine.evidence.select import FoundSpan, Selection, Turn, found_spans, select
from engine.evidence.spans import DocumentSpans
from engine.prompt import check_question, encode_document
from engine.recall_plan import recall_budget
from engine.settings import EngineSettings
from engine.tokenizer_cache import TextTokenizer, text_tokenizer


@dataclass
class FindResult:
    """What `find_spans` found: `rows`, best first; `continues`, why the question goes on from the
    last of the earlier ones ("" when it starts afresh or there were none); `document`, as read."""

    rows: list[FoundSpan]
    continues: str
    document: Document


def find_spans(path: str | os.PathLike[str], question: str, settings: EngineSettings, *, after: Sequence[str] = (),
               follow_up: bool | None = None, limit: int = 10, password: str | None = None,
               progress: ProgressCallback | None = None) -> FindResult:
    """The spans `question` would read in the document at `path` (read as `load_reusing` reads it),
    after the earlier questions `after` (oldest first; `follow_up` as in `select_after`: None lets
    the words decide), with the settings' model's tokenizer and recall budget. Raises
    HalamanError for an empty question, DocumentError and its kinds for a file that cannot be
    read, ModelError when the model's tokenizer cannot be found."""
    check_question(question)
    document = load_reusing(path, password=password, progress=progress, include_generated=settings.include_generated_files)
    tokenizer = text_tokenizer(settings.model)
    spans = document_spans(document, tokenizer)
    try:
        selection, continues = select_after(question, after, question_chooser(spans, settings, tokenizer), spans.structure,
                                            follow_up=follow_up)
        return FindResult(found_spans(selection, spans, document, limit), continues, document)
    finally:
        spans.close()


def document_spans(document: Document, tokenizer: TextTokenizer) -> DocumentSpans:
    """`document`'s spans, full-text index and structure, its tokens counted by `tokenizer` exactly
    as the model's open counts them (`engine.prompt.encode_document`); the offsets and the index
    are kept for the next run (`engine.evidence.kept_spans`). Raises HalamanError when the
    tokenizer gives no character offsets."""
    def encode() -> Encoded:
        encoding = encode_document(tokenizer, tokenizer.layout, document)
        if not encoding.token_chars:
            raise HalamanError(f"{tokenizer.label}'s tokenizer gives no character offsets: spans cannot be found")
        return encoding.token_chars, encoding.head_tokens, encoding.text_tokens, len(encoding.ids)

    return kept_spans(document, tokenizer.key, encode)


def question_chooser(spans: DocumentSpans, settings: EngineSettings,
                     tokenizer: TextTokenizer) -> Callable[[str, Sequence[Turn]], Selection]:
    """(question, history) -> that question's selection of `spans`, with the budgets `DocumentSession.select` gives it (an archive's,
    not a re-read's: find shows what the document read whole would recall; the model's reading
    budget from the tokenizer's kept profile, without loading the model)."""
    budget = recall_budget(settings, tokenizer.profile.max_positions, reread=False)
    reading = reading_budget(tokenizer.profile)  # the model's, from its config: as the session's
    return lambda question, history: select(spans, question, budget_tokens=budget,
                                            max_spans=settings.recall.max_spans, history=history, reading=reading)


__all__ = ["FindResult", "document_spans", "find_spans", "question_chooser"]
