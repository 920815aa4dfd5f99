"""Whether a question goes on from the previous one, decided from the question's own words, so a
conversation needs no "Follow-up" box: "What examples does it use?" after "What is chapter 5
about?" reads chapter 5 again, "What is chapter 15 about?" does not.

A question continues when it refers back (a third-person pronoun: "it", "they", "its", "his"),
opens as a continuation ("And …", "What about …", "Why?"), or is too short to name anything
("Example?", "More details?"). It starts afresh when it names a part of the document through its
structure ("chapter 8", "the preface", "Which chapter is about files?") or asks about the whole
document ("Who is this book written for?"): what it names wins over a pronoun it also holds. A
follow-up keeps the previous question's spans as candidates (`engine.evidence.select`, signal
"conversation"); the words of the question still choose beside them, so a wrong "continues"
costs a page, a wrong "afresh" the thread.

The rules are those chat apps without a box imply (LM Studio, Jan, AnythingLLM send the whole
conversation every time); here only the spans carry over, so the decision is explicit and shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from engine.evidence.select import Selection, Turn, asks_about_whole
from engine.evidence.structure import DocumentStructure

# Third-person pronouns point back at what was asked or answered before. Not "this"/"that" (a
# relative "that" and "this book" are no reference), not "one" (a number as often as a pronoun),
# not "I"/"you" (the people talking).
_REFERS_BACK = re.compile(r"\b(it|its|it's|itself|they|them|their|theirs|themselves|he|him|his|himself|she|hers|"
                          r"herself|these|those|the same|such|the former|the latter|the above|the previous)\b", re.I)
_CONTINUES = re.compile(r"^\s*(and|also|but|so|then|or|what about|how about|and what|why|why not|how come|"
                        r"what else|anything else|more|another|which one|what for|for example|e\.g\.|say more|"
                        r"tell me more|go on|explain)\b", re.I)
SHORT_WORDS = 3
"""A question of at most this many words names nothing of its own ("Why?", "Any examples?")."""


def continuation(question: str, previous: str | None, structure: DocumentStructure | None = None) -> str | None:
    """Why `question` goes on from `previous` (e.g. "refers back: it"), or None when it starts
    afresh: no previous question, a part named through `structure` (its outline, headings or
    contents pages), or a question about the whole document. Pure; raises nothing."""
    if not previous or not question.strip():
        return None
    if asks_about_whole(question):
        return None
    if structure is not None and structure.references(question):
        return None
    opening = _CONTINUES.match(question)
    if opening:
        return f"goes on from it: “{opening.group(1).strip()} …”"
    pronoun = _REFERS_BACK.search(question)
    if pronoun:
        return f"refers back: “{pronoun.group(1)}”"
    if len(re.findall(r"\w+", question)) <= SHORT_WORDS:
        return "too short to name anything new"
    return None


ASKED_AS_FOLLOW_UP = "asked as a follow-up"
"""Why a question goes on from the last one when the user said so (Follow-up ticked, `--follow-up`)."""


def continues_why(question: str, previous: str | None, structure: DocumentStructure | None = None,
                  follow_up: bool | None = None) -> str:
    """Why `question` goes on from `previous` ("" when it starts afresh): `follow_up` True says so
    (`ASKED_AS_FOLLOW_UP`), False starts afresh, None lets its words decide (`continuation`)."""
    if follow_up is not None:
        return ASKED_AS_FOLLOW_UP if follow_up else ""
    return continuation(question, previous, structure) or ""


def conversation_turns(questions: Sequence[str], choose: Callable[[str, Sequence[Turn]], Selection],
                       structure: DocumentStructure | None = None) -> list[Turn]:
    """The turns a conversation of `questions` (oldest first) leaves, each question asked as the
    window asks it (follow_up=None): it keeps the turns before it when `continuation` says it goes
    on from the last one, else it starts them afresh; its own spans are `choose(question, history)`'s.
    Returns the turns since the last fresh start, oldest first (empty for no questions)."""
    history: list[Turn] = []
    for question in questions:
        if not (history and continuation(question, history[-1].question, structure)):
            history = []
        history.append(Turn(question, choose(question, history).chosen_index))
    return history


def select_after(question: str, after: Sequence[str], choose: Callable[[str, Sequence[Turn]], Selection],
                 structure: DocumentStructure | None = None, *, follow_up: bool | None = None) -> tuple[Selection, str]:
    """What `question` reads after the earlier questions `after` (oldest first), as the window's
    conversation decides it (`DocumentSession.ask` with follow_up=None): each question continues
    the one before it when `continuation` says so and keeps the spans it read, else starts afresh.
    `choose(question, history)` selects for one question (`engine.evidence.select.select`).
    `follow_up`: True continues the last question whatever its words, False starts afresh, None
    decides. Returns the selection and why it continues ("" when it is a new question)."""
    history = conversation_turns(after, choose, structure)
    why = continues_why(question, after[-1], structure, follow_up) if after else ""
    return choose(question, history if why else []), why


__all__ = ["ASKED_AS_FOLLOW_UP", "SHORT_WORDS", "continuation", "continues_why", "conversation_turns", "select_after"]
