"""`halaman find` without the model (engine.find, engine.tokenizer_cache) and a command-line
conversation decided as the window decides it (engine.evidence.conversation.select_after): the
same rows as the model-loaded path, on the real book with the embedded model's tokenizer."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pypdf import PdfReader

from engine import tokenizer_cache
from engine.documents import load_document
from engine.evidence.select import found_spans
from engine.find import find_spans
from engine.models.source import resolve
from engine.prompt import chat_layout, encode_document
from engine.session import DocumentSession
from engine.settings import EngineSettings

REPO = Path(__file__).resolve().parent.parent
BOOK = "pdf/P16_thinkpython2.pdf"
FIRST, FOLLOW, UNRELATED = "What is chapter 5 about?", "What examples does it use?", "How do I open a file for writing?"


def chapter_pages(path, k: int) -> set[int]:
    """The 1-based pages of chapter `k`, from where pypdf reads "Chapter k" and "Chapter k+1" start."""
    starts = {}
    for page, pdf_page in enumerate(PdfReader(path).pages, 1):
        found = re.match(r"\s*Chapter\s*(\d+)\s*\n", pdf_page.extract_text() or "")
        if found:
            starts.setdefault(int(found.group(1)), page)
    return set(range(starts[k], starts[k + 1]))


@pytest.fixture(scope="module")
def book(smol, corpus):
    """The book read, with the model-loaded path's spans (the model's own tokenizer)."""
    document = load_document(corpus / BOOK)
    session = DocumentSession(smol, EngineSettings(), None)
    spans = session.spans_of(document)
    yield session, document, spans
    spans.close()


@pytest.mark.parametrize(("question", "after"), [
    ("What is chapter 8 about?", ()),
    ("What is this book about?", ()),
    ("Which built-in type maps keys to values?", ()),
    ("Can you give an example of it?", ("Which built-in type maps keys to values?",)),
])
def test_find_without_the_model_lists_the_rows_the_loaded_model_lists(book, corpus, question, after):
    session, document, spans = book
    expected = found_spans(session.select(question, after=after, spans=spans, follow_up=None), spans, document, 12)
    found = find_spans(corpus / BOOK, question, EngineSettings(), after=after, limit=12)
    assert [dataclasses.asdict(r) for r in found.rows] == [dataclasses.asdict(r) for r in expected]
    assert sum(r.tokens for r in found.rows) > 1000  # token counts, not zeros


def test_the_tokenizer_from_the_gguf_alone_is_the_loaded_models(smol, corpus, tmp_path, monkeypatch):
    """Built from the GGUF's metadata in a home where the model was never converted, kept, and read
    back: the same ids, character offsets, chat template pieces and shape as the loaded model's."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))
    built = tokenizer_cache.text_tokenizer("default")
    kept = list((tmp_path / "cache" / tokenizer_cache.CACHE_FOLDER).glob("*.json"))
    assert len(kept) == 1 and not (tmp_path / "cache" / "models").exists()  # nothing converted
    again = tokenizer_cache.text_tokenizer("default")
    document = load_document(corpus / BOOK)
    reference = encode_document(smol.tokenizer, chat_layout(smol.tokenizer), document)
    for tokenizer in (built, again):
        assert tokenizer.layout == chat_layout(smol.tokenizer) and tokenizer.profile == smol.profile
        assert encode_document(tokenizer, tokenizer.layout, document) == reference
    special = "a <|im_end|> b"
    for split in (True, False):
        assert again(special, add_special_tokens=False, split_special_tokens=split)["input_ids"] == \
            smol.tokenizer(special, add_special_tokens=False, split_special_tokens=split)["input_ids"]
    kept[0].write_text("{not json")  # damaged: built again, not an error
    assert tokenizer_cache.text_tokenizer("default").profile == smol.profile
    assert json.loads(kept[0].read_text())["format"] == tokenizer_cache.FORMAT


def _halaman(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ), cwd=REPO)


def test_halaman_find_imports_neither_torch_nor_transformers_once_the_tokenizer_is_kept(corpus):
    tokenizer_cache.text_tokenizer("default")  # kept in the test home
    out = _halaman(f"import sys; from engine.cli import main; code = main(['find', {str(corpus / BOOK)!r}, "
                   f"{FIRST!r}, '--json']); print('torch' in sys.modules, 'transformers' in sys.modules, code)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False False 0"


def _find_pages(corpus, capsys, *args) -> tuple[set[int], str]:
    from engine.cli import main

    assert main(["find", str(corpus / BOOK), *args, "--json"]) == 0
    out = capsys.readouterr()
    return {row["page"] for row in json.loads(out.out) if row["chosen"]}, out.err


def test_find_after_a_question_continues_only_when_the_words_go_on(corpus, capsys):
    chapter5 = chapter_pages(corpus / BOOK, 5)
    pages, said = _find_pages(corpus, capsys, FOLLOW, "--after", FIRST)
    assert "continuing from your last question" in said and pages & chapter5, (said, pages)
    pages, said = _find_pages(corpus, capsys, UNRELATED, "--after", FIRST)
    assert "a new question" in said and not pages & chapter5, (said, pages)
    pages, said = _find_pages(corpus, capsys, FOLLOW, "--after", FIRST, "--new-question")
    assert "a new question" in said and not pages & chapter5, (said, pages)
    pages, said = _find_pages(corpus, capsys, UNRELATED, "--after", FIRST, "--follow-up")
    assert "continuing from your last question" in said and pages & chapter5, (said, pages)


@pytest.mark.parametrize(("question", "continues"), [(FOLLOW, True), (UNRELATED, False)])
def test_ask_after_a_question_reads_its_chapter_only_when_it_goes_on(corpus, question, continues):
    """The real model answers; the recall line names the pages the answer re-read."""
    out = subprocess.run([sys.executable, "-m", "engine.cli", "ask", str(corpus / BOOK), question, "--after", FIRST,
                          "--max-new-tokens", "4", "--no-history"],
                         capture_output=True, text=True, timeout=900, env=dict(os.environ), cwd=REPO)
    assert out.returncode == 0, out.stderr
    said = "continuing from your last question" if continues else "a new question"
    assert said in out.stderr, out.stderr
    recall = next(line for line in out.stdout.splitlines() if line.startswith("recall"))
    read = {int(p) for p in re.findall(r"page (\d+)", recall)}
    assert bool(read & chapter_pages(corpus / BOOK, 5)) == continues, recall


def test_a_loaded_models_tokenizer_is_kept_for_find(smol, corpus, tmp_path, monkeypatch):
    """`load_model` keeps the tokenizer it loaded (`keep_loaded`): find then reads it, building nothing."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))
    tokenizer_cache.keep_loaded("default", smol.tokenizer, smol.profile)

    def no_build(source):
        raise AssertionError(f"built {source.label} again")

    monkeypatch.setattr(tokenizer_cache, "_build", no_build)
    kept = tokenizer_cache.text_tokenizer("default")
    assert kept.label == resolve("default").label and kept.profile == smol.profile
    document = load_document(corpus / "pdf" / "P05_dmca.pdf")
    assert encode_document(kept, kept.layout, document) == encode_document(smol.tokenizer, chat_layout(smol.tokenizer), document)


def test_a_second_find_reads_the_kept_spans_and_a_damaged_file_is_rebuilt(smol, corpus, tmp_path, monkeypatch):
    import engine.find
    from engine.evidence import kept_spans

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))
    tokenizer_cache.keep_loaded("default", smol.tokenizer, smol.profile)
    first = find_spans(corpus / BOOK, FIRST, EngineSettings(), limit=12).rows
    folder = tmp_path / "cache" / kept_spans.CACHE_FOLDER
    assert {p.suffix for p in folder.iterdir()} == {".tokens", ".index"}
    encode = engine.find.encode_document

    def no_encode(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(engine.find, "encode_document", no_encode)
    assert find_spans(corpus / BOOK, FIRST, EngineSettings(), limit=12).rows == first  # kept: not tokenized again
    next(folder.glob("*.index")).write_bytes(b"not an index")  # damaged: rebuilt from the spans
    assert find_spans(corpus / BOOK, FIRST, EngineSettings(), limit=12).rows == first
    monkeypatch.setattr(engine.find, "encode_document", encode)
    next(folder.glob("*.tokens")).write_bytes(b"short")  # damaged: tokenized again
    assert find_spans(corpus / BOOK, FIRST, EngineSettings(), limit=12).rows == first
    assert kept_spans.clear() == 2 and not list(folder.iterdir())
