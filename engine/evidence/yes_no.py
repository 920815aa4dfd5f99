"""A yes/no answer that the passages it quotes contradict (`contradiction`).

Why: a small model answers "No, Corning does not have positive working capital" while the balance
sheet it read says total current assets exceed total current liabilities; a number check has
nothing to compare (the answer states no figure) and the names are all in the document. Two
checks, both conservative (when in doubt, no mark: a false mark on a right answer costs the user's
trust in every mark):

1. Negation: the answer's claim (its first sentence, the "Yes,"/"No," left out) and a quoted
   sentence share most of their content words but one of them is negated and the other is not
   ("No, the keys and values do not have to be strings" against "the keys and values have to be
   strings or bytes"). The claim's polarity must be plain: a "No," followed by an affirmative
   claim, or a "Yes," followed by a negated one, is left alone. The method is the negation cue of
   textual-entailment baselines (the "negation words" feature of MacCartney et al., "Learning to
   recognize features of valid textual entailments", NAACL 2006), restricted to near-identical
   sentences, where it is precise.
2. A sign the quoted table decides: for a question about a quantity with a textbook definition as
   the difference of two statement rows (working capital = total current assets − total current
   liabilities), the rows' first figures (the latest period: a filing's statements put it first)
   give the true answer. Only rows that the quoted text holds are used; nothing is looked up
   elsewhere in the document.

Torch-free, pure: plain strings in, a `Contradiction` or None out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_YES_NO_QUESTION = re.compile(r"(?:is|are|was|were|does|do|did|has|have|had|can|could|will|would|should)\b", re.IGNORECASE)
_LEAD = re.compile(r"\s*(yes|no)\b[\s,.;:!-]*", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|no|never|none|nor|cannot)\b|n't\b", re.IGNORECASE)
_WORD = re.compile(r"[a-z][a-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# Words that carry no claim of their own (and the negation words, compared separately).
_FUNCTION_WORDS = frozenset(["the", "a", "an", "and", "or", "of", "to", "in", "on", "at", "by", "for", "with", "from", "as", "that", "this", "these", "those", "is", "are", "was", "were", "be", "been", "being", "has", "have", "had", "do", "does", "did", "it", "its", "their", "there", "here", "which", "who", "what", "when", "than", "then", "so", "such", "not", "no", "never", "none", "nor", "cannot", "can", "could", "would", "should", "will", "may", "might", "must", "any", "all", "some", "also", "only", "very", "based", "data", "yes"])
SHARED_CONTENT = 0.75
"""A quoted sentence is compared only when it holds this share of the claim's content words."""
MIN_SHARED_WORDS = 3
"""... and at least this many of them: a two-word claim matches too much."""

# Quantities with a textbook definition as the difference of two statement rows: the phrase that
# names them in a question, and the rows (minuend, subtrahend) as a filing's statements label them.
SIGN_RULES = {
    "positive working capital": ("total current assets", "total current liabilities"),
}
_ROW_FIGURE = r"[\s$]*(\(?[\d,]+(?:\.\d+)?\)?)"


@dataclass(frozen=True)
class Contradiction:
    """The answer's `claim` (its first sentence, as written), the quoted `label` (page) that says
    otherwise, and `evidence`: the quoted sentence, or the two rows with their figures."""

    claim: str
    label: str
    evidence: str

    def note(self) -> str:
        """One line for a reader: 'check the yes/no: page 60 says otherwise: “…”'."""
        return f"check the yes/no: {self.label} says otherwise: \u201c{self.evidence}\u201d"


def asks_yes_no(question: str) -> bool:
    """Whether `question` (its first sentence) is a yes/no question: it opens with an auxiliary
    verb ("Is", "Does", "Was there", "Has")."""
    return bool(_YES_NO_QUESTION.match(question.strip()))


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()


def _stem(word: str) -> str:
    # A crude prefix stem: "cyclical"/"cyclicality", "strings"/"string" meet at 5 characters.
    return word[:5]


def _content(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _FUNCTION_WORDS}


def answer_polarity(answer: str) -> tuple[bool | None, str]:
    """(True for yes, False for no, None when unclear; the claim: the first sentence without its
    leading "Yes,"/"No,"). A "No," with an affirmative claim or a "Yes," with a negated one is
    unclear ("Yes, there was no drop" answers a question about a drop)."""
    first = _first_sentence(answer)
    lead = _LEAD.match(first)
    claim = first[lead.end():] if lead else first
    negated = bool(_NEGATION.search(claim))
    if lead is None:
        return (not negated), claim
    said_yes = lead.group(1).lower() == "yes"
    return (said_yes if said_yes != negated else None), claim


def _negation_contradiction(claim: str, says_yes: bool, label: str, text: str) -> Contradiction | None:
    words = _content(claim)
    if len(words) < MIN_SHARED_WORDS:
        return None
    for sentence in _SENTENCE_END.split(text):
        shared = words & _content(sentence)
        if len(shared) < max(MIN_SHARED_WORDS, SHARED_CONTENT * len(words)):
            continue
        if bool(_NEGATION.search(sentence)) == says_yes:  # the sentence negated, the answer yes; or the reverse
            return Contradiction(claim, label, " ".join(sentence.split()))
    return None


def _figure(text: str) -> float:
    value = float(text.strip("()").replace(",", ""))
    return -value if text.startswith("(") else value


def _sign_contradiction(question: str, says_yes: bool, claim: str, label: str, text: str) -> Contradiction | None:
    folded = " ".join(text.split())
    for phrase, (minuend, subtrahend) in SIGN_RULES.items():
        if phrase not in question.lower():
            continue
        first = re.search(re.escape(minuend) + _ROW_FIGURE, folded, re.IGNORECASE)
        second = re.search(re.escape(subtrahend) + _ROW_FIGURE, folded, re.IGNORECASE)
        if first is None or second is None:
            continue
        positive = _figure(first.group(1)) > _figure(second.group(1))
        if positive != says_yes:
            return Contradiction(claim, label, f"{first.group(0).strip()} … {second.group(0).strip()}")
    return None


def contradiction(question: str, answer: str, passages: Sequence[tuple[str, str]]) -> Contradiction | None:
    """The first of `passages` ((label, text) pairs: the quoted passages, strongest first) that
    contradicts the yes/no `answer` to `question` (see the module docstring), or None: when the
    question is not a yes/no question, the answer's polarity is unclear, or no passage says
    otherwise."""
    if not asks_yes_no(question):
        return None
    says_yes, claim = answer_polarity(answer)
    if says_yes is None or not claim:
        return None
    for label, text in passages:
        found = (_sign_contradiction(question, says_yes, claim, label, text)
                 or _negation_contradiction(claim, says_yes, label, text))
        if found is not None:
            return found
    return None


__all__ = ["SIGN_RULES", "Contradiction", "answer_polarity", "asks_yes_no", "contradiction"]
