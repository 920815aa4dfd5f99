"""Prompt layout: the document is a token-identical prefix for every question.

The model's chat template is rendered once around sentinel strings and cut there, so that

    prefix   = <template head> + instructions + document text + <template up to the user turn>
    question = question text + <template from the end of the user turn to the assistant turn>

are tokenized separately and concatenated. The prefix's token ids then never depend on the
question, which is what makes the prefix cache (and its key over exact token ids) work.

The document goes into the system message and the question into the user message: on the
embedded SmolLM2-135M that layout gave the most on-topic answers of three we tried (document and
question together in the user message made it recite the document).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from engine.errors import HalamanError

INSTRUCTIONS = (
    "You answer questions about the document below. Use only the document. "
    "Cite the page or file you used, like [page 12] or [src/app.py]. Be brief."
)
_SYSTEM = "\x00HALAMAN-SYSTEM\x00"
_USER = "\x00HALAMAN-USER\x00"
_ANSWER = "\x00HALAMAN-ANSWER\x00"
_NEXT = "\x00HALAMAN-NEXT\x00"


@dataclass(frozen=True)
class ChatLayout:
    """Template pieces: `before_system + system + before_user + question + after_user` opens an
    assistant turn; `after_answer + question + after_user` is a follow-up after an answer."""

    before_system: str
    before_user: str
    after_user: str
    after_answer: str


def chat_layout(tokenizer) -> ChatLayout:
    """Cut the tokenizer's chat template at sentinels. Raises ValueError if it has no template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model has no chat template; use an instruction-tuned (chat) model")
    system = {"role": "system", "content": _SYSTEM}
    one = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": _USER}], tokenize=False, add_generation_prompt=True
    )
    two = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER},
         {"role": "user", "content": _NEXT}],
        tokenize=False, add_generation_prompt=True,
    )
    before_system, rest = one.split(_SYSTEM)
    before_user, after_user = rest.split(_USER)
    after_answer = two.split(_ANSWER, 1)[1].split(_NEXT, 1)[0]
    return ChatLayout(before_system, before_user, after_user, after_answer)


def document_prefix(layout: ChatLayout, document_text: str) -> tuple[str, str, str]:
    """The cached prefix as (template head + instructions, document, template up to the user turn).

    Kept apart so the caller tokenizes the document with special-token strings split: a PDF that
    contains "<|im_end|>" must not end the system turn.
    """
    return f"{layout.before_system}{INSTRUCTIONS}\n\nDocument:\n\n", document_text.strip(), layout.before_user


def question_suffix(layout: ChatLayout, question: str) -> tuple[str, str, str]:
    """(template, user text, template) after the prefix for a first question."""
    return "", question.strip(), layout.after_user


def follow_up_suffix(layout: ChatLayout, question: str) -> tuple[str, str, str]:
    """(template, user text, template) after an answer (already in the cache) for a follow-up."""
    return layout.after_answer, question.strip(), layout.after_user


@dataclass(frozen=True)
class PrefixEncoding:
    """The prompt prefix of a document: `ids`; `segment_starts`, the first token of each segment;
    `token_chars`, the character offset in `Document.render()` of each document-text token (empty
    when the tokenizer gives no offsets); `head_tokens` before the text; `text_tokens` of it."""

    ids: list[int]
    segment_starts: list[int]
    token_chars: list[int]
    head_tokens: int
    text_tokens: int


def encode_document(tokenizer, layout: ChatLayout, document) -> PrefixEncoding:
    """Token ids of `document`'s prefix (`document_prefix`), with where each segment and the text
    start in them; special-token strings in the document are split into ordinary tokens."""
    head, text, tail = document_prefix(layout, document.render())
    ids = tokenizer(head, add_special_tokens=False)["input_ids"] if head else []
    encoded = tokenizer(text, add_special_tokens=False, split_special_tokens=True,
                        return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)))
    starts: list[int] = []
    token_chars: list[int] = []
    if "offset_mapping" in encoded:
        token_chars = [begin for begin, _ in encoded["offset_mapping"]]
        starts = [len(ids) + bisect.bisect_left(token_chars, marker) for marker, _ in document.offsets()]
    head_tokens, text_tokens = len(ids), len(encoded["input_ids"])
    ids += encoded["input_ids"]
    ids += tokenizer(tail, add_special_tokens=False)["input_ids"]
    return PrefixEncoding(ids, starts, token_chars, head_tokens, text_tokens)


def check_question(question: str, about: str = "the document") -> None:
    """Raise HalamanError when `question` is empty or only spaces (`about`: what it would ask about,
    for the message). Every question path checks here, before any model work."""
    if not question.strip():
        raise HalamanError(f"the question is empty: type a question about {about}")
