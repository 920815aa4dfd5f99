"""How much a question reads follows the model (engine.evidence.reading_budget, issue 42 item 1):
the embedded 135M model keeps its small budget, a 1.5B-shape model with a 32k window reads up to 6
pages (six words spans); select() honours either; a page whose text runs on brings the next one with a large budget;
`halaman find` reads the budget from the tokenizer's kept profile, as the session does from the model."""

from pathlib import Path

import pytest
from transformers import Qwen2Config

from engine.documents import load_document
from engine.evidence.reading_budget import LARGE, SMALL, parameters, reading_budget
from engine.evidence.select import asks_for_several, select
from engine.find import question_chooser, document_spans
from engine.models.profile import ModelProfile
from engine.settings import EngineSettings
from engine.tokenizer_cache import TextTokenizer, text_tokenizer

# Qwen2.5-1.5B-Instruct's config.json numbers (1,543,714,304 parameters on its model card).
QWEN_1_5B = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                        num_key_value_heads=2, max_position_embeddings=32768, vocab_size=151936)
QUESTION = "What is the lease term of the harbour office?"


@pytest.fixture(scope="module")
def embedded():
    """The embedded model's tokenizer and profile, read from its GGUF without loading the model."""
    return text_tokenizer("default")


def test_the_embedded_model_keeps_the_small_budget_and_a_1_5b_shape_reads_up_to_six(embedded):
    small = embedded.profile
    assert (small.hidden_size, small.intermediate_size) == (576, 1536)  # read from the GGUF's metadata
    assert parameters(small) == pytest.approx(134_515_008, rel=0.01)
    large = ModelProfile.from_config(QWEN_1_5B)
    assert parameters(large) == pytest.approx(1_543_714_304, rel=0.01)
    assert reading_budget(small) == SMALL and reading_budget(large) == LARGE
    assert SMALL.words_at_most == 3 and 6 <= LARGE.words_at_most <= 8
    # 1.7B parameters with an 8k window is not enough: the window must hold the pages too
    assert reading_budget(ModelProfile.from_config(Qwen2Config(**{**QWEN_1_5B.to_dict(), "max_position_embeddings": 8192}))) == SMALL


def _office_book(path: Path) -> Path:
    """Ten pages that each state something about the harbour office's lease, in equal words."""
    from pdf_fixtures import helvetica_book

    pages = [[f"Clause {k}: the lease term of the harbour office, as schedule {k} sets it out for floor {k}."]
             for k in range(1, 11)]
    return helvetica_book(path, pages)


def _words_pages(spans, document, reading) -> list[int]:
    selection = select(spans, QUESTION, budget_tokens=6144, max_spans=12, reading=reading)
    return [document.segments[s.segment].page for s, c in zip(selection.chosen, selection.reasons(), strict=True)
            if c.signal == "words"]


def test_select_reads_three_pages_for_the_small_budget_and_six_for_the_large(embedded, tmp_path):
    document = load_document(_office_book(tmp_path / "office.pdf"))
    spans = document_spans(document, embedded)
    try:
        assert len(_words_pages(spans, document, SMALL)) == 3
        assert len(_words_pages(spans, document, LARGE)) == LARGE.words_at_most
        # find takes the budget from the tokenizer's profile: a 1.5B-shape profile reads six
        settings = EngineSettings()
        shaped = TextTokenizer(embedded.backend, embedded.layout, ModelProfile.from_config(QWEN_1_5B), "1.5B shape")
        assert len(question_chooser(spans, settings, shaped)(QUESTION, ()).chosen) == LARGE.words_at_most
        assert len(question_chooser(spans, settings, embedded)(QUESTION, ()).chosen) == 3
    finally:
        spans.close()


def test_a_page_whose_sentence_runs_on_brings_the_next_page_with_a_large_budget(embedded, tmp_path):
    from pdf_fixtures import helvetica_book

    filler = [[f"Schedule {k}: parking spaces and the cleaning rota for the second floor."] for k in range(4)]
    cut = ["Clause 9: the lease term of the harbour office is five years, and it may be extended",
           "by the tenant for a further period of"]
    after = ["three years on six months' notice, in writing, to the landlord."]
    document = load_document(helvetica_book(tmp_path / "cut.pdf", [*filler[:2], cut, after, *filler[2:]]))
    spans = document_spans(document, embedded)
    try:
        chosen = select(spans, QUESTION, budget_tokens=6144, max_spans=12, reading=LARGE)
        large = [document.segments[s.segment].page for s in chosen.chosen]
        why = {document.segments[s.segment].page: c.signal for s, c in zip(chosen.chosen, chosen.reasons(), strict=True)}
        small = [document.segments[s.segment].page for s in select(spans, QUESTION, budget_tokens=6144, max_spans=12,
                                                                   reading=SMALL).chosen]
    finally:
        spans.close()
    assert 3 in large and 4 in large, large  # the answer's second half is on page 4
    assert why[4] == "continuation", why  # listed under its own reason (find shows it)
    assert small == [3], small


@pytest.mark.parametrize(("question", "several"), [
    ("Compare the gross margin of FY2021 and FY2022.", True),
    ("How did revenue change from 2020 to 2022?", True),
    ("What was the capital expenditure in FY2019 and in FY2020?", True),
    ("What was the capital expenditure in FY2022?", False),
    ("What is chapter 8 about?", False),
])
def test_a_question_asking_for_several_things_is_told_apart(question, several):
    assert asks_for_several(question) is several
