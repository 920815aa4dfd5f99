"""How much a question reads, per model: how many spans the question's words alone may add, and
how close to the best one a further span must score (`engine.evidence.select`).

How few pages to read is a property of the model, not of the question. The embedded SmolLM2-135M
misreads long inputs: pages beside the one that answers distracted it (every words span within
60 % of the best, up to 12, in document order: P16-dev-hard 7 → 4 answers, docs/BENCHMARKS.md
§7b). It reads up to 3 words spans within half the best's score (4 for a question asking for
several things) with the best last, nearest the question: placed there, the extra pages cost it no
answer on the dev sets, while the evidence is read for 32 of 35 filing questions instead of 26.
A model of at least `LARGE_PARAMETERS` parameters with at least `LARGE_CONTEXT_TOKENS` positions
(Qwen2.5-1.5B, Llama-3.2-1B/3B; SmolLM2-1.7B has 8k and stays small) reads up to
`LARGE.words_at_most` words spans: 6–8 pages fit in the recall budget (6,144 tokens, 12 spans). Its page counts are measured (bench/evidence_rules.py);
its answers are not: no such model's weights were at hand, so it rests on the premise that a 1.5B–3B
model with a 32k window reads 6–8 pages well.

    budget = reading_budget(model.profile)      # ModelProfile: from the config or the GGUF metadata
    select(spans, question, budget_tokens=..., max_spans=..., reading=budget)

The size is the parameter count computed from the profile's shape, as `engine.models.catalog`
computes it (decoder linear layers + one embedding matrix): `halaman find` reads it from the
tokenizer's kept profile without loading the model, the session from the loaded model's config,
so both choose the same spans.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.profile import ModelProfile

LARGE_PARAMETERS = 1_000_000_000
"""Parameters from which a model reads the larger budget (with LARGE_CONTEXT_TOKENS positions)."""
LARGE_CONTEXT_TOKENS = 32_768
"""Positions (max_position_embeddings) from which a model reads the larger budget."""


@dataclass(frozen=True)
class ReadingBudget:
    """How many spans a question's words may add to its reading (`engine.evidence.select._choose`).

    words_at_most: words spans read when nothing else chose any (the best, then those within
      `words_relative` of it); words_relative: a further words span is read when its BM25 score is
      at least this share of the best; beside_structure / beside_reference: words spans read beside
      section or conversation spans / beside what the question names through the structure
      ("chapter 8"); several_at_least: words spans a question asking for several things ("compare",
      two years, a list) reads even below `words_relative` (within `words_at_most`); neighbours:
      a chosen page's next page is read too when the text runs on across the page break (a table or
      sentence cut by it), within the budget; pages_at_least: when the rules above read fewer
      pages (or files) than this, the next pages of the ranking (any signal, in its order: the
      pages `halaman find` lists next) are read, each by its best span, until this many are, within
      the budget and the span limit (0: none; measured on the public sets and the filings:
      docs/BENCHMARKS.md §7e); best_last: the spans are recalled in the reverse of the ranking's
      order, the best last, nearest the question (a model reading its spans in focus, or re-reading
      them, takes positions in that order; False: document order)."""

    words_at_most: int = 3
    words_relative: float = 0.8
    beside_structure: int = 2
    beside_reference: int = 1
    several_at_least: int = 1
    neighbours: bool = False
    pages_at_least: int = 0
    best_last: bool = False
    label: str = "small model"


SMALL = ReadingBudget(words_relative=0.5, several_at_least=4, best_last=True)
"""The embedded 135M model's: the best words span and up to two more within half its score, four
for a question asking for several things, recalled best last (docs/BENCHMARKS.md §7b, §7e: the
evidence read for 32 of 35 filing questions and 81 % of the public sets' at 2.5 pages; the dev
sets' answers as many as with 3 within 80 % in document order)."""
LARGE = ReadingBudget(words_at_most=6, words_relative=0.5, several_at_least=2, neighbours=True, label="large model")
"""A ≥ 1B-parameter model's with ≥ 32k positions: up to 6 words spans within half the best's score
(FinanceBench-dev: the evidence read for 32 of 35 questions at 3.8 pages on average; up to 8 spans
found no more and read 4.4 pages; more words spans beside a section's or a chapter's pages found
none either: docs/BENCHMARKS.md §7b), a question for several things at least 2, and a page's
continuation when its text runs on."""


def parameters(profile: ModelProfile) -> int:
    """The model's parameter count from its shape: every decoder layer's q, k, v, o projections and
    gated MLP (3·h·I) plus one vocabulary × hidden embedding (as `engine.models.catalog`). A profile
    without hidden_size takes query_heads · head_dim; one without intermediate_size takes 8/3 of
    the hidden size (the Llama MLP ratio). Returns parameters, > 0."""
    d = profile.head_dim
    hidden = profile.hidden_size or profile.query_heads * d
    mlp = profile.intermediate_size or (8 * hidden) // 3
    attention = hidden * profile.query_heads * d * 2 + hidden * profile.kv_heads * d * 2
    return profile.num_layers * (attention + 3 * hidden * mlp) + profile.vocab_size * hidden


def reading_budget(profile: ModelProfile | None) -> ReadingBudget:
    """The reading budget of the model of `profile` (None: the embedded model's, `SMALL`):
    `LARGE` for ≥ LARGE_PARAMETERS parameters and ≥ LARGE_CONTEXT_TOKENS positions, else `SMALL`."""
    if profile is None:
        return SMALL
    if parameters(profile) >= LARGE_PARAMETERS and profile.max_positions >= LARGE_CONTEXT_TOKENS:
        return LARGE
    return SMALL


__all__ = ["LARGE", "SMALL", "ReadingBudget", "parameters", "reading_budget"]
