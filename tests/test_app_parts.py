"""The app's parts that need no model: library status and history rows (real SQLite), citation
links, the answer footer, error descriptions."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from app.chat import citations, footer_text, link_citations, sources_line  # noqa: E402
from app.library import CACHED, NOT_CACHED, STALE, Library, MessageRecord, config_signature  # noqa: E402
from app.worker import describe_error  # noqa: E402
from engine.documents import DamagedPdfError, PasswordRequiredError  # noqa: E402
from engine.errors import Cancelled, ModelError  # noqa: E402
from engine.settings import CachePolicy, EngineSettings  # noqa: E402


def test_library_prefix_cache_status_cached_stale_not_cached(tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("hello\n")
    settings = EngineSettings()
    library = Library(tmp_path / "library.sqlite")
    doc_id = library.upsert_document(path=str(doc), title="a.txt", kind="text", tokens=42, prefix_key="k1",
                                     config_sig=config_signature(settings))
    record = library.document(doc_id)
    assert record.size_text == "text file" and record.tokens == 42
    assert library.status(record, {"k1"}, settings) == CACHED
    assert library.status(record, set(), settings) == NOT_CACHED           # evicted or cleared
    assert library.status(record, {"k1"}, settings.replace(prefix_cache=False)) == NOT_CACHED
    other_policy = settings.replace(cache=CachePolicy(budget_tokens=2048))
    assert library.status(record, {"k1"}, other_policy) == STALE           # made with another cache policy
    time.sleep(0.01)
    doc.write_text("hello, changed\n")
    assert library.status(record, {"k1"}, settings) == STALE               # the file changed since
    # Re-opening records the new state; the same path is one row.
    assert library.upsert_document(path=str(doc), title="a.txt", kind="text", tokens=43, prefix_key="k2",
                                   config_sig=config_signature(settings)) == doc_id
    assert library.status(library.document(doc_id), {"k2"}, settings) == CACHED
    assert len(library.documents()) == 1
    library.close()


def test_history_rows_survive_and_a_streaming_answer_becomes_interrupted(tmp_path):
    path = tmp_path / "library.sqlite"
    library = Library(path)
    doc_id = library.upsert_document(path="/x.pdf", title="x", kind="pdf", pages=3)
    library.add_message(doc_id, "user", "Why?")
    answer_id = library.add_message(doc_id, "assistant", "Because", state="streaming", source="local")
    library.close()  # the app died mid-answer
    again = Library(path)
    messages = again.messages(doc_id)
    assert [(m.role, m.text, m.state) for m in messages] == [("user", "Why?", "done"), ("assistant", "Because", "interrupted")]
    assert again.message(answer_id).source == "local"
    again.remove_document(doc_id)
    assert again.documents() == [] and again.messages(doc_id) == []
    again.close()


def test_citations_become_links_outside_code_and_unknown_ones_are_marked():
    text = "See [page 2] and [src/app.py]; not [1] or [x].\n\n```python\nx = a[page 3]\n```\nAlso `[page 4]`."
    assert citations(text) == ["page 2", "src/app.py"]
    linked = link_citations(text)
    assert "[[page 2]](cite:page%202)" in linked and "[[src/app.py]](cite:src/app.py)" in linked
    assert "x = a[page 3]" in linked and "`[page 4]`" in linked and "[1]" in linked
    line = sources_line(text, {"page 2", "page 1"})
    assert "cite:page%202" in line and "src/app.py (not in the document)" in line
    assert sources_line("no citations", None) == ""


def test_footer_says_where_an_answer_came_from_and_what_it_cost():
    local = MessageRecord(1, 1, "assistant", "x", "done", 0.0, source="local", model="SmolLM2", ttft_s=0.31,
                          tokens_per_s=3.2, tokens=12, prefix_hit=1, stop_reason="end")
    assert footer_text(local) == "local · SmolLM2 · TTFT 0.31 s · 3.2 tokens/s · prefix cache hit · 12 tokens"
    cloud = MessageRecord(2, 1, "assistant", "y", "done", 0.0, source="cloud", endpoint="https://api.example.com/v1",
                          model="gpt-x", reason="low confidence", ttft_s=0.5, stop_reason="end")
    assert footer_text(cloud) == "cloud · https://api.example.com/v1 · model gpt-x · reason: low confidence · TTFT 0.50 s"
    cancelled = MessageRecord(3, 1, "assistant", "z", "cancelled", 0.0, source="local", stop_reason="cancelled")
    assert footer_text(cancelled).endswith("cancelled")


def test_engine_errors_become_readable_job_errors():
    import torch

    assert describe_error(Cancelled()).kind == "cancelled"
    assert describe_error(PasswordRequiredError("a.pdf is password-protected")).kind == "password"
    damaged = describe_error(DamagedPdfError("a.pdf is incomplete: download it again"))
    assert damaged.kind == "document" and damaged.message == "a.pdf is incomplete: download it again"
    assert describe_error(ModelError("model not found")).kind == "model"
    oom = describe_error(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert oom.kind == "oom" and "lower the KV budget" in oom.message
    try:
        {}["oops"]
    except KeyError as exc:
        bug = describe_error(exc)
    assert bug.kind == "bug" and "Traceback" in bug.details and "Traceback" not in bug.message


def test_library_keeps_a_path_that_is_not_utf8(tmp_path):
    """B02 in the app: a folder named with Latin-1 bytes is stored, found and given back exactly."""
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/men\xfc-repo")
    os.mkdir(folder)
    library = Library(tmp_path / "library.sqlite")
    doc_id = library.upsert_document(path=folder, title="menü-repo", kind="repo", files=1)
    assert library.document(doc_id).path == folder and library.find(folder).id == doc_id
    assert [r.path for r in library.documents()] == [folder]
    library.close()


def test_engine_goes_on_without_an_unusable_prefix_store(tmp_path, monkeypatch):
    """The window's engine: a prefix folder that cannot be used gives one notice, no exception."""
    from app.worker import Engine

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "prefix").write_text("a file where the cache folder should be")
    engine = Engine(EngineSettings())
    assert engine._store() is None and engine._store() is None  # tried once
    assert engine.prefix_cache_usage() == (0, 0) and engine.clear_prefix_cache() == 0
    [notice] = engine._store_notices
    assert notice.startswith("the prefix cache cannot be used (")
