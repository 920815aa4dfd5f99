"""Draft answer tokens from the document itself (prompt lookup decoding).

Answers about a document quote it. When the last few tokens of the answer also occur in the
document, the tokens that followed them there are a cheap guess for what comes next; the model
checks the whole guess in one forward pass and keeps the longest prefix it agrees with, so the
output is exactly greedy decoding (Saxena, "Prompt Lookup Decoding", 2023,
github.com/apoorvumang/prompt-lookup-decoding; transformers' `prompt_lookup_num_tokens`). On a CPU a
decode step is bound by reading the weights, so checking 8 tokens costs little more than feeding 1.
"""

from __future__ import annotations

from collections.abc import Sequence

# Longest n-gram matched first; shorter ones only when it is not found.
MAX_NGRAM = 3
MIN_NGRAM = 2


class PromptLookup:
    """N-gram index over the document's tokens plus the question and answer so far.

    `propose(k)` returns up to `k` tokens that followed the latest occurrence of the context's last
    `MAX_NGRAM` (then fewer, down to `MIN_NGRAM`) tokens: in the answer and question first (an
    answer repeats itself), else in the document. Building the index costs one pass over the
    document (≈0.2 s per 100k tokens); `extend` adds tokens as they are generated.
    """

    def __init__(self, document_ids: Sequence[int]) -> None:
        self.document = list(document_ids)
        self._doc_index: dict[tuple[int, ...], int] = {}
        _index_ngrams(self._doc_index, self.document, 0)
        self.context: list[int] = []
        self._context_index: dict[tuple[int, ...], int] = {}

    def reset(self, context_ids: Sequence[int]) -> None:
        """Start a new answer whose context so far (the question suffix) is `context_ids`."""
        self.context = []
        self._context_index = {}
        self.extend(context_ids)

    def extend(self, token_ids: Sequence[int]) -> None:
        """Append tokens to the context (each generated token, as it is accepted)."""
        start = len(self.context)
        self.context.extend(token_ids)
        _index_ngrams(self._context_index, self.context, start)

    def propose(self, k: int) -> list[int]:
        """Up to `k` draft tokens that would follow the context (empty when nothing matches)."""
        if k <= 0:
            return []
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if len(self.context) < n:
                continue
            key = tuple(self.context[-n:])
            end = self._context_index.get(key)
            if end is not None:
                return self.context[end : end + k]
            end = self._doc_index.get(key)
            if end is not None:
                return self.document[end : end + k]
        return []


def _index_ngrams(index: dict[tuple[int, ...], int], ids: list[int], start: int) -> None:
    """Add to `index` each n-gram of `ids` ending at a position ≥ `start` -> the position just after
    it, the latest occurrence winning. An n-gram that ends `ids` is left out: nothing follows it
    yet (in the context it is indexed once a later token arrives; in the document never)."""
    for n in range(MIN_NGRAM, MAX_NGRAM + 1):
        for end in range(max(n, start), len(ids)):
            index[tuple(ids[end - n : end])] = end
