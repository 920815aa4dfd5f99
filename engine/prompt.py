"""Prompt layout: the document is a token-identical prefix for every question.

The model's chat template is rendered once around sentinel strings and cut there, so that

    prefix   = <template up to the user message> + document text
    question = "Question: ..." + <template from the end of the user message to the assistant turn>

are tokenized separately and concatenated. The prefix's token ids then never depend on the
question, which is what makes the prefix cache (and its key over exact token ids) work.
"""

from __future__ import annotations

from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You answer questions about the document below. Use only the document. "
    "Cite the page or file you used, like [page 12] or [src/app.py]. Be brief."
)
_USER = "\x00HALAMAN-USER\x00"
_ANSWER = "\x00HALAMAN-ANSWER\x00"
_NEXT = "\x00HALAMAN-NEXT\x00"


@dataclass(frozen=True)
class ChatLayout:
    """Template pieces around the content: `before_user + content + after_user` opens an assistant
    turn; `after_answer + content + after_user` is a follow-up turn after an answer."""

    before_user: str
    after_user: str
    after_answer: str


def chat_layout(tokenizer) -> ChatLayout:
    """Cut the tokenizer's chat template at sentinels. Raises ValueError if it has no template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model has no chat template; use an instruction-tuned (chat) model")
    system = {"role": "system", "content": SYSTEM_PROMPT}
    one = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": _USER}], tokenize=False, add_generation_prompt=True
    )
    two = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER},
         {"role": "user", "content": _NEXT}],
        tokenize=False, add_generation_prompt=True,
    )
    before_user, after_user = one.split(_USER)
    after_answer = two.split(_ANSWER, 1)[1].split(_NEXT, 1)[0]
    return ChatLayout(before_user=before_user, after_user=after_user, after_answer=after_answer)


def document_prefix(layout: ChatLayout, document_text: str) -> str:
    """Text of the cached prefix: template head + the document."""
    return f"{layout.before_user}Document:\n\n{document_text.strip()}\n\n"


def question_suffix(layout: ChatLayout, question: str) -> str:
    """Text after the prefix for a first question."""
    return f"Question: {question.strip()}{layout.after_user}"


def follow_up_suffix(layout: ChatLayout, question: str) -> str:
    """Text after an answer (which is already in the cache) for a follow-up question."""
    return f"{layout.after_answer}{question.strip()}{layout.after_user}"
