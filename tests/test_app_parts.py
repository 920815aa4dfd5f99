"""The app's parts that need no model: library status and history rows (real SQLite), citation
links, the answer footer, error descriptions."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from app.chat import footer_text, link_citations, sources_line  # noqa: E402
from app.worker import describe_error  # noqa: E402
from engine.citations import citations  # noqa: E402
from engine.documents import DamagedPdfError, PasswordRequiredError  # noqa: E402
from engine.errors import Cancelled, ModelError  # noqa: E402
from engine.library import CACHED, NOT_CACHED, STALE, Library, MessageRecord  # noqa: E402
from engine.settings import CachePolicy, EngineSettings  # noqa: E402


def test_library_prefix_cache_status_follows_the_prefix_keys_rule(tmp_path):
    """Stale exactly when opening would miss: the file changed, or any field of the prefix key but
    the token ids would differ now (engine.prefix_store.PrefixConfig), weights and dtype included."""
    import dataclasses

    from engine.prefix_store import PrefixConfig
    from engine.workspace import CacheStatus

    doc = tmp_path / "a.txt"
    doc.write_text("hello\n")
    settings = EngineSettings()
    made = PrefixConfig("model-sha", "tokenizer-sha", dataclasses.asdict(CachePolicy()), "float32/float16", {"format": "2"})
    library = Library(tmp_path / "library.sqlite")
    doc_id = library.upsert_document(path=str(doc), title="a.txt", kind="text", tokens=42, prefix_key="k1",
                                     config_sig=made.signature)
    record = library.document(doc_id)
    now = CacheStatus(frozenset({"k1"}), {42: made.signature})
    assert record.size_text == "text file" and record.tokens == 42
    assert library.status(record, now, settings) == CACHED
    assert library.status(record, CacheStatus(frozenset()), settings) == NOT_CACHED          # evicted or cleared
    assert library.status(record, now, settings.replace(prefix_cache=False)) == NOT_CACHED
    # Another model fingerprint (the same model name with other weights), dtype or policy: a miss, so stale.
    for changed in (dataclasses.replace(made, model_fingerprint="model-sha-int4"),
                    dataclasses.replace(made, dtype="float32/float32"),
                    dataclasses.replace(made, policy={**made.policy, "budget_tokens": 8192})):
        assert library.status(record, CacheStatus(now.keys, {42: changed.signature}), settings) == STALE
    # The same fields made again (say "auto" positions that resolve as before): the same key, cached.
    assert library.status(record, CacheStatus(now.keys, {42: dataclasses.replace(made).signature}), settings) == CACHED
    assert library.status(record, CacheStatus(now.keys), settings) == CACHED               # no model yet: the file only
    time.sleep(0.01)
    doc.write_text("hello, changed\n")
    assert library.status(record, now, settings) == STALE                                  # the file changed since
    # Re-opening records the new state; the same path is one row.
    assert library.upsert_document(path=str(doc), title="a.txt", kind="text", tokens=43, prefix_key="k2",
                                   config_sig=made.signature) == doc_id
    assert library.status(library.document(doc_id), now.adding("k2", 43, made.signature), settings) == CACHED
    assert library.status(library.document(doc_id), now.adding("k2", 43, made.signature).cleared(), settings) == NOT_CACHED
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
    assert "[[page 2]](cite:page%202#7)" in link_citations(text, 7)  # the answer's id: its own highlights
    assert "x = a[page 3]" in linked and "`[page 4]`" in linked and "[1]" in linked
    line = sources_line(text, {"page 2", "page 1"})
    assert "cite:page%202" in line and "src/app.py (not in the document)" in line
    assert sources_line("no citations", None) == ""


def test_footer_says_where_an_answer_came_from_and_what_it_cost():
    local = MessageRecord(1, 1, "assistant", "x", "done", 0.0, source="local", model="SmolLM2", ttft_s=0.31,
                          tokens_per_s=3.2, tokens=12, prefix_hit=1, stop_reason="end")
    assert footer_text(local) == ("answered here by SmolLM2 · first words after 0.31 s · 3.2 tokens/s · "
                                  "saved reading of the document reused · 12 tokens")
    cloud = MessageRecord(2, 1, "assistant", "y", "done", 0.0, source="cloud", endpoint="https://api.example.com/v1",
                          model="gpt-x", reason="low confidence", ttft_s=0.5, stop_reason="end")
    assert footer_text(cloud) == ("answered by the cloud: model gpt-x at https://api.example.com/v1 · why: low confidence · "
                                  "first words after 0.50 s")
    cancelled = MessageRecord(3, 1, "assistant", "z", "cancelled", 0.0, source="local", stop_reason="cancelled")
    assert footer_text(cancelled).endswith("cancelled")


def test_engine_errors_become_readable_job_errors():
    import torch

    from engine.errors import ErrorKind

    assert describe_error(Cancelled()).kind is ErrorKind.CANCELLED
    assert describe_error(PasswordRequiredError("a.pdf is password-protected")).kind is ErrorKind.PASSWORD
    damaged = describe_error(DamagedPdfError("a.pdf is incomplete: download it again"))
    assert damaged.kind is ErrorKind.DOCUMENT and damaged.message == "a.pdf is incomplete: download it again"
    assert describe_error(ModelError("model not found")).kind is ErrorKind.MODEL
    oom = describe_error(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert oom.kind is ErrorKind.OOM and "lower the KV budget" in oom.message
    try:
        {}["oops"]
    except KeyError as exc:
        bug = describe_error(exc)
    assert bug.kind is ErrorKind.BUG and "Traceback" in bug.details and "Traceback" not in bug.message


# ------------------------------------------------------------------------------------ recall
# Real engine values (Source, RecallStats, MemoryBreakdown, estimate), real SQLite, real Qt widgets
# offscreen: what the window shows of recall, without a model.
V1_SCHEMA = """
CREATE TABLE [documents] ([id] INTEGER PRIMARY KEY, [path] TEXT NOT NULL, [title] TEXT NOT NULL, [kind] TEXT NOT NULL,
  [pages] INTEGER, [files] INTEGER, [tokens] INTEGER, [prefix_key] TEXT, [config_sig] TEXT, [file_sig] TEXT,
  [added_s] FLOAT NOT NULL, [opened_s] FLOAT);
CREATE UNIQUE INDEX [idx_documents_path] ON [documents] ([path]);
CREATE TABLE [messages] ([id] INTEGER PRIMARY KEY, [document_id] INTEGER NOT NULL REFERENCES [documents]([id]),
  [role] TEXT NOT NULL, [text] TEXT NOT NULL, [state] TEXT NOT NULL, [created_s] FLOAT NOT NULL, [source] TEXT,
  [endpoint] TEXT, [model] TEXT, [reason] TEXT, [ttft_s] FLOAT, [tokens_per_s] FLOAT, [tokens] INTEGER,
  [prefix_hit] INTEGER, [stop_reason] TEXT);
CREATE INDEX [idx_messages_document_id] ON [messages] ([document_id]);
PRAGMA user_version = 1;
"""


def _answer_record(**fields) -> MessageRecord:
    return MessageRecord(1, 1, "assistant", fields.pop("text", "It is on [page 2]."), "done", 0.0, source="local",
                         model="SmolLM2", ttft_s=0.31, tokens_per_s=3.2, tokens=12, prefix_hit=1, stop_reason="end", **fields)


def test_a_library_from_before_recall_opens_and_gains_the_recall_columns(tmp_path):
    import sqlite3

    from engine.library import SCHEMA_VERSION
    from engine.answer import Source
    from engine.kvcache.recall import RecallStats
    from engine.workspace import recall_record, sources_json

    path = tmp_path / "library.sqlite"
    old = sqlite3.connect(path)
    old.executescript(V1_SCHEMA)
    old.execute("INSERT INTO documents (path, title, kind, pages, added_s) VALUES ('/x.pdf', 'x', 'pdf', 3, 1.0)")
    old.execute("INSERT INTO messages (document_id, role, text, state, created_s, source, tokens) "
                "VALUES (1, 'assistant', 'An old answer', 'done', 2.0, 'local', 7)")
    old.commit()
    old.close()

    library = Library(path)
    (before,) = library.messages(1)
    assert (before.text, before.tokens, before.sources, before.recall) == ("An old answer", 7, [], None)
    assert footer_text(before) == "answered here · 7 tokens"  # nothing about recall for an answer from before it
    sources = [Source("page 12", 0.41, page=12), Source("page 3", 0.22, page=3)]
    stats = RecallStats(blocks_scored=900, blocks_recalled=804, tokens_recalled=16200, bytes_read=2304000,
                        score_s=0.122, read_s=0.234)
    new_id = library.add_message(1, "assistant", "A new answer", source="local", sources_json=sources_json(sources),
                                 recall_json=recall_record(stats, None, heads=90))
    library.close()

    again = Library(path)  # opening a migrated file again changes nothing
    assert again.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert {"sources_json", "recall_json", "passages_json", "mean_logprob", "low_confidence", "unsupported_json"} <= set(again.db["messages"].columns_dict)
    stored = again.message(new_id)
    assert stored.sources == sources  # engine Sources, shares and pages intact
    assert stored.recall["tokens_per_head"] == 180 and stored.recall["blocks_recalled"] == 804
    assert abs(stored.recall["seconds"] - 0.356) < 1e-9
    assert again.message(before.id).sources == [] and again.message(before.id).passages == []
    again.close()


def test_the_footer_says_which_spans_an_answer_read_and_why():
    from app.chat import read_spans
    from engine.workspace import recall_record
    from engine.kvcache.recall import RecallStats

    stats = RecallStats(tokens_recalled=90 * 600, spans=("page 15", "page 105", "page 106"), signals=("words", "structure", "structure"),
                        reasons=("matching words", "chapter 8", "chapter 8"), score_s=0.002)
    record = _answer_record(recall_json=recall_record(stats, None, heads=90))
    assert " · read page 15 (matching words); page 105, page 106 (chapter 8) · recall 600 tokens in 2 ms" in footer_text(record)
    assert read_spans(["page 1", "page 2"], []) == "page 1, page 2"  # stored before reasons were


def test_the_footer_says_what_recall_cost_or_that_it_was_off():
    from app.chat import recall_text
    from engine.workspace import recall_record
    from engine.kvcache.recall import RecallStats
    from engine.recall_plan import RecallPlan, RecallSource

    archive = RecallPlan(RecallSource.ARCHIVE, "questions read the pages they choose from the archive")
    stats = RecallStats(tokens_recalled=92160, blocks_recalled=2880, blocks_scored=9000, score_s=0.004, read_s=0.008)
    used = _answer_record(recall_json=recall_record(stats, archive, heads=90))
    assert footer_text(used) == ("answered here by SmolLM2 · first words after 0.31 s · 3.2 tokens/s · "
                                 "saved reading of the document reused · 12 tokens · recall 1,024 tokens in 12 ms")
    off = _answer_record(recall_json=recall_record(None, RecallPlan(RecallSource.OFF, "recall_tokens is 0")))
    assert footer_text(off).endswith("12 tokens · recall off")
    no_archive = _answer_record(recall_json=recall_record(None, RecallPlan(RecallSource.REREAD, "", "disk full")))
    assert recall_text(no_archive) == "recall off (no archive for this document)"
    whole = _answer_record(recall_json=recall_record(None, RecallPlan(RecallSource.WHOLE, "")))
    assert recall_text(whole) == "recall off (the cache keeps the whole document)"
    cloud = MessageRecord(2, 1, "assistant", "y", "done", 0.0, source="cloud", endpoint="https://e/v1", model="m",
                          recall_json=recall_record(None, archive))
    assert "recall" not in footer_text(cloud)  # the cloud answered: local recall does not apply


def test_attended_sources_show_under_the_answer_apart_from_citations_and_click_like_them(qtbot):
    from PySide6.QtCore import Qt

    from app.chat import ATTENDED_TIP, ChatView, attended_line
    from engine.answer import Source
    from engine.workspace import sources_json

    assert attended_line([]) == ""
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 400)
    view.show()
    view.labels = {"page 2", "page 3", "page 12"}
    sources = [Source("page 12", 0.41, page=12), Source("page 3", 0.224, page=3)]
    view.show_messages([
        MessageRecord(1, 1, "user", "When?", "done", 0.0),
        _answer_record(sources_json=sources_json(sources)),
    ])
    lines = view.toPlainText().splitlines()
    assert "Cited: page 2" in lines                       # what the text cites
    assert "Attended: page 12 (41 %) · page 3 (22 %)" in lines  # where the attention went
    assert lines.index("Cited: page 2") < lines.index("Attended: page 12 (41 %) · page 3 (22 %)")
    assert lines[-1].startswith("answered here by SmolLM2")  # then the footer

    # Each attended label is a cite: link, with the tooltip that says what it is.
    block = view.document().begin()
    anchors: dict[str, int] = {}
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().isAnchor():
                anchors[fragment.charFormat().anchorHref()] = fragment.position()
            it += 1
        block = block.next()
    assert {"cite:page%2012#1", "cite:page%203#1", "cite:page%202#1"} <= set(anchors)  # answer 1's
    cursor = view.textCursor()
    cursor.setPosition(anchors["cite:page%2012#1"] + 1)
    rect = view.cursorRect(cursor)
    assert view.tooltip_at(rect.center()) == ATTENDED_TIP and "attention" in ATTENDED_TIP
    # A real click on "page 12" goes where a citation click goes.
    with qtbot.waitSignal(view.citation_clicked, timeout=2000) as clicked:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert clicked.args == ["page 12", 1]


def test_the_gauge_shows_the_tokens_recalled_for_the_question(qtbot):
    from app.gauge import COLORS, MemoryGauge, kv_segments
    from engine.kvcache.cache import MemoryBreakdown
    from engine.memory import MemoryReport

    kv = MemoryBreakdown(codes_bytes=400_000, quant_meta_bytes=50_000, residual_bytes=80_000, recalled_bytes=2_534_400)
    report = MemoryReport("cpu", 100_000_000, kv, 1_000_000, 8_000_000_000, 4_000_000_000, budget_bytes=13_687_920)
    assert ("recalled", 2_534_400) in kv_segments(report)
    gauge = MemoryGauge()
    qtbot.addWidget(gauge)
    gauge.show()
    assert not gauge.device_bar.isVisible() and not gauge.kv_bar.isVisible()  # no report yet: no empty bars
    gauge.set_report(report)
    assert gauge.device_bar.isVisible() and gauge.kv_bar.isVisible()
    assert ("recalled", 2_534_400) in gauge.kv_bar.segments
    assert COLORS["recalled"] not in (COLORS["codes"], COLORS["meta"], COLORS["residual"], COLORS["index"])
    assert "recalled for this question 2.4 MiB" in gauge.kv_legend.text()
    assert "recalled for this question</td><td align='right'>2,534,400 bytes" in gauge.toolTip()
    assert f"{kv.total_bytes:,} bytes" in gauge.toolTip()  # the KV total counts the recalled tokens


def test_the_settings_dialog_edits_recall_and_shows_its_memory_and_disk(qtbot, tmp_path, memory_keyring):
    from app.settings_dialog import SettingsDialog
    from engine.estimate import KNOWN_SHAPES, estimate
    from engine.settings import RecallSettings, load_settings
    from engine.units import format_bytes

    settings = EngineSettings(recall=RecallSettings(archive_bits=2, block_tokens=64, recall_tokens=512))
    file = tmp_path / "settings.toml"
    dialog = SettingsDialog(settings, settings_file=file)
    qtbot.addWidget(dialog)
    assert dialog.recall.archive.isChecked() and dialog.recall.archive_bits.currentData() == 2
    assert dialog.recall.tokens.value() == 512 and dialog.recall.block.value() == 64
    assert dialog.values() == settings

    profile, policy = KNOWN_SHAPES["smollm2-135m"], settings.cache
    est = estimate(profile, policy, policy.budget_tokens, settings.recall)
    per_100k = estimate(profile, policy, 100_000, settings.recall).archive_bytes
    info = dialog.recall.info.text()
    assert f"<b>{format_bytes(est.recall_bytes)}</b> of memory" in info
    assert f"archive on disk: <b>{format_bytes(per_100k)}</b> per 100,000 tokens" in info
    assert f"+ {format_bytes(est.recall_bytes)} recalled" in dialog.cache.budget_info.text()

    dialog.recall.archive_bits.setCurrentIndex(dialog.recall.archive_bits.findData(4))
    dialog.recall.tokens.setValue(1024)
    bigger = estimate(profile, policy, policy.budget_tokens, RecallSettings(recall_tokens=1024, block_tokens=64))
    assert f"<b>{format_bytes(bigger.recall_bytes)}</b> of memory" in dialog.recall.info.text()  # live
    dialog.recall.block.setValue(48)  # does not divide the 512-token prefill chunk: the engine's message
    assert "must divide the prefill chunk" in dialog.error.text()
    dialog.recall.block.setValue(32)
    assert dialog.error.text() == ""
    dialog.recall.tokens.setValue(0)
    assert dialog.recall.tokens.text() == "off" and "Recall per question is off" in dialog.recall.info.text()
    dialog.recall.archive.setChecked(False)
    assert "Recall is off" in dialog.recall.info.text() and not dialog.recall.archive_bits.isEnabled()
    dialog.recall.archive.setChecked(True)
    dialog.recall.tokens.setValue(256)
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert dialog.saved.recall == RecallSettings(archive=True, archive_bits=4, block_tokens=32, recall_tokens=256)
    assert load_settings(file).recall == dialog.saved.recall  # through [recall] in settings.toml

    # With a document open, the archive's size is the document's own.
    sized = SettingsDialog(dialog.saved, settings_file=file, document_tokens=40_000)
    qtbot.addWidget(sized)
    archive = estimate(profile, dialog.saved.cache, 40_000, dialog.saved.recall).archive_bytes
    assert f"archive on disk: <b>{format_bytes(archive)}</b> for this document (40,000 tokens)" in sized.recall.info.text()


def test_a_recall_off_warning_is_never_among_the_warnings_left_out_of_the_banner():
    from app.open_flow import warning_note
    from engine.open_document import RecallGap, RecallNotice

    notice = RecallNotice(RecallGap.OFF, "it has no archive (read before recall existed, or the archive was off)")
    warnings = ["skipped (minified): a.js", "skipped (binary): b.png", "ignored by .gitignore: build/", str(notice)]
    note = warning_note(warnings, str(notice))
    assert note.startswith("Note: recall is off for this document: it has no archive") and note.endswith("(and 1 more)")
    assert warning_note(warnings[:2]) == "Note: skipped (minified): a.js; skipped (binary): b.png"


def test_library_keeps_a_path_that_is_not_utf8(tmp_path):
    """B02 (docs/REAL_WORLD_INPUTS.md) in the app: a folder named with Latin-1 bytes is stored, found and given back exactly."""
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/men\xfc-repo")
    os.mkdir(folder)
    library = Library(tmp_path / "library.sqlite")
    doc_id = library.upsert_document(path=folder, title="menü-repo", kind="repo", files=1)
    assert library.document(doc_id).path == folder and library.find(folder).id == doc_id
    assert [r.path for r in library.documents()] == [folder]
    library.close()


def test_the_reading_row_gives_rows_back_and_never_takes_the_users_pick(qtbot):
    from app.library_panel import LibraryPanel, LibraryRow

    panel = LibraryPanel()
    qtbot.addWidget(panel)
    rows = [LibraryRow(1, "/a.pdf", "A", "12 pages · cached", "cached", False),
            LibraryRow(2, "/b.pdf", "B", "3 pages · cached", "cached", False)]
    panel.show_documents(rows, select=2)
    texts = lambda: [panel.list.item(r).text() for r in range(panel.list.count())]  # noqa: E731
    panel.set_reading("/a.pdf", "A", "reading 40 %")
    assert texts() == ["A\nreading 40 %", "B\n3 pages · cached"]
    panel.set_reading("/new.txt", "new.txt", "reading…")  # A's read was replaced by a new document's
    assert texts() == ["new.txt\nreading…", "A\n12 pages · cached", "B\n3 pages · cached"]
    assert panel.list.currentItem().text().startswith("B")  # the user's pick keeps the highlight
    panel.show_documents(rows, select=2)  # a redraw (cache status) keeps the reading row and the pick
    assert texts()[0] == "new.txt\nreading…" and panel.list.currentItem().text().startswith("B")
    panel.set_reading(None)
    assert texts() == ["A\n12 pages · cached", "B\n3 pages · cached"]


# ------------------------------------------------------------------------- the worker's client
# A real EngineClient and worker thread; these jobs need no model.
@pytest.fixture
def client(qtbot, tmp_path, monkeypatch):
    from app.worker import EngineClient

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    client = EngineClient(EngineSettings())
    yield client
    assert client.shutdown()


def test_jobs_are_cancelled_by_their_handle_not_by_their_name(qtbot, client):
    import threading

    from app import operations as ops
    from app.worker import Job
    from engine.errors import ErrorKind

    gate = threading.Event()
    results: dict[str, object] = {}
    client.submit(Job("hold", lambda workspace, ctx: gate.wait(10)))  # keeps the next two queued
    first = client.submit(ops.prefix_cache_status(set(), on_done=lambda status: results.setdefault("first", status),
                                                  on_error=lambda error: results.setdefault("first", error)))
    second = client.submit(ops.prefix_cache_status(set(), on_done=lambda status: results.setdefault("second", status)))
    assert first.name == second.name  # the same operation twice: only the handle tells them apart
    client.cancel([first, None])
    gate.set()
    qtbot.waitUntil(lambda: not client.busy, timeout=10_000)
    assert results["first"].kind is ErrorKind.CANCELLED and results["second"].keys == frozenset()


def test_a_settings_change_is_decided_once_and_applied_by_the_client(qtbot, client, monkeypatch):
    import dataclasses

    from engine.workspace import SettingsChange

    decided = []
    between = SettingsChange.between.__func__

    def counted(cls, old, new):
        decided.append((old, new))
        return between(cls, old, new)

    monkeypatch.setattr(SettingsChange, "between", classmethod(counted))
    old = client.settings
    new = old.replace(cache=old.cache.replace(budget_tokens=old.cache.budget_tokens * 2))
    applied: list[SettingsChange] = []
    assert client.apply_settings(new, on_done=applied.append) is SettingsChange.REOPEN_DOCUMENT
    assert client.settings is new  # at once, for what the window does next
    qtbot.waitUntil(lambda: bool(applied), timeout=10_000)
    assert applied == [SettingsChange.REOPEN_DOCUMENT] and client.workspace.settings is new
    assert decided == [(old, new)]  # once: the worker applies the client's decision

    # Settings the engine refuses change nothing, here either.
    invalid = dataclasses.replace(new, cloud=dataclasses.replace(new.cloud, enabled=True, base_url="ftp://x"))
    errors = []
    client.apply_settings(invalid, on_error=errors.append)
    qtbot.waitUntil(lambda: bool(errors), timeout=10_000)
    assert client.settings is new and client.workspace.settings is new and "https://" in errors[0].message


def test_the_document_state_follows_reads_and_ignores_replaced_ones(qtbot, tmp_path):
    from app.answer_stream import AnswerStream
    from app.chat import ChatView
    from app.document_state import DocumentState
    from app.notices import ProgressPanel
    from app.worker import Job
    from engine.documents import load_document
    from engine.kvcache.cache import MemoryBreakdown
    from engine.open_document import OpenReport

    library = Library(tmp_path / "library.sqlite")
    chat = ChatView()
    qtbot.addWidget(chat)
    state = DocumentState(AnswerStream(library, chat, ProgressPanel(), max_new_tokens=lambda: 8))
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("Alpha.\n")
    second.write_text("Beta.\n")
    old_read, new_read = Job("open", lambda workspace, ctx: None), Job("open", lambda workspace, ctx: None)
    state.reading(str(first), None, old_read)
    state.reading(str(second), None, new_read)  # replaces the first read
    assert state.document_jobs() == [new_read] and not state.ready
    document = load_document(second)
    report = OpenReport(title="b.txt", kind="text", document_tokens=3, prefix_hit=False, position_mode="original",
                        seconds=0.1, prefill_seconds=0.1, prefill_tokens_per_s=30.0, kv=MemoryBreakdown(), full_fp16_bytes=0)
    assert not state.opened(old_read, 1, str(first), report, document) and not state.read_ended(old_read)
    assert state.opening == str(second) and state.open_id is None  # the replaced read changed nothing

    doc_id = library.upsert_document(path=str(second), title="b.txt", kind="text")
    assert state.opened(new_read, doc_id, str(second), report, document)
    assert state.opening is None and state.engine_path == str(second) and "Beta." in state.segments[document.segments[0].label]
    assert not state.ready  # the chat does not show it yet
    state.show(library.document(doc_id))
    assert state.ready and state.is_open(state.current) and state.document_jobs() == []

    # A settings change that reopens it, refused: back to ready; removing it forgets it.
    before = state.reopening(str(second))
    assert not state.ready and state.engine_path == str(second)
    assert state.reopen_failed(str(second), before) and state.ready
    state.removed(doc_id)
    assert state.current is None and state.open_id is None and state.document is None and not state.ready
    library.close()


def test_each_settings_section_loads_settings_and_gives_back_its_fields(qtbot, memory_keyring):
    """The dialog is built from sections, each with load(settings) / values(); together they give
    back every field the dialog edits, unchanged, and keep the ones it does not (chunk, temperature)."""
    from app.settings_dialog import SettingsDialog
    from app.settings_sections import CacheSection, CloudSection, ModelSection, PrefixSection, RecallSection
    from engine.settings import CloudSettings, RecallSettings

    settings = EngineSettings(
        model="HuggingFaceTB/SmolLM2-360M-Instruct", device="cpu", max_new_tokens=320,
        cache=CachePolicy(budget_tokens=2048, sink_tokens=8, window_tokens=256, residual_tokens=32, kv_bits=8, chunk_tokens=256),
        recall=RecallSettings(archive_bits=2, block_tokens=64, recall_tokens=512),
        prefix_cache=False, prefix_cache_disk_bytes=768 * 1024 * 1024,
        cloud=CloudSettings(enabled=True, base_url="https://llm.example/v1", model="m-1", temperature=0.7,
                            auto_escalate=True, escalation_threshold=-1.25, ask_before_sending=False),
    )
    edited = set()
    for section in (ModelSection(), CacheSection(), RecallSection(), PrefixSection(), CloudSection()):
        qtbot.addWidget(section)
        section.load(settings)
        fields = section.values()
        assert fields and all(getattr(settings, name) == value for name, value in fields.items()), type(section)
        edited |= set(fields)
    assert edited == {"model", "device", "max_new_tokens", "cache", "recall", "prefix_cache", "prefix_cache_disk_bytes", "cloud"}
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    assert dialog.values() == settings and dialog.error.text() == ""
    dialog.cache.window_tokens.setValue(4096)  # more than the budget: the engine's own message, at once
    assert "smaller than sink + window" in dialog.error.text()


def test_the_cache_policys_terms_are_under_a_collapsed_advanced_section_each_explained(qtbot, tmp_path, memory_keyring):
    """Issue 32, item 12: Settings speaks of the memory kept for a document; sinks, window,
    residual and KV bits are in an Advanced part, closed until opened, with their terms explained."""
    from PySide6.QtCore import Qt

    from app.settings_dialog import SettingsDialog

    settings = EngineSettings(cache=CachePolicy(budget_tokens=2048, sink_tokens=8, window_tokens=256, residual_tokens=32, kv_bits=8))
    dialog = SettingsDialog(settings, settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    dialog.show()
    cache = dialog.cache
    terms = {cache.sink: "sinks", cache.window_tokens: "window", cache.residual: "residual", cache.kv_bits: "bits"}
    assert cache.budget.isVisible() and not any(widget.isVisible() for widget in terms)
    assert "memory" in cache.title().lower() and "memory" in cache.budget.toolTip()
    qtbot.mouseClick(cache.advanced_toggle, Qt.MouseButton.LeftButton)
    assert all(widget.isVisible() for widget in terms)
    for widget, term in terms.items():
        tip = widget.toolTip()
        assert term in tip.lower() and len(tip.split()) >= 12, tip  # a sentence that explains, not the label again
    assert dialog.values() == settings  # hidden or shown, the fields are the settings'
    qtbot.mouseClick(cache.advanced_toggle, Qt.MouseButton.LeftButton)
    assert not cache.sink.isVisible()


def test_the_recall_fields_are_under_the_collapsed_advanced_section_each_explained(qtbot, tmp_path, memory_keyring):
    """Issue 32 (window, second pass), item 4: archive, archive bits, recall per question and block
    are hidden with the cache's terms until Advanced is opened, each with a tooltip that explains
    its term in a sentence, on the field and on its label."""
    from PySide6.QtCore import Qt

    from app.settings_dialog import SettingsDialog

    dialog = SettingsDialog(EngineSettings(), settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    dialog.show()
    recall = dialog.recall
    terms = {recall.archive: "archive", recall.archive_bits: "bits", recall.tokens: "recall", recall.block: "block"}
    assert not any(widget.isVisible() for widget in terms) and not recall.info.isVisible()
    qtbot.mouseClick(dialog.cache.advanced_toggle, Qt.MouseButton.LeftButton)
    assert all(widget.isVisible() for widget in terms) and recall.info.isVisible()
    for widget, term in terms.items():
        tip = widget.toolTip()
        assert term in tip.lower() and len(tip.split()) >= 15, tip
        label = recall.form.labelForField(widget)
        assert label is None or label.toolTip() == tip
    qtbot.mouseClick(dialog.cache.advanced_toggle, Qt.MouseButton.LeftButton)
    assert not recall.tokens.isVisible()
    assert dialog.values() == EngineSettings()


def test_ticking_the_cloud_fallback_asks_for_its_endpoint_and_keeps_the_estimates(qtbot, tmp_path, memory_keyring):
    """Issue 32, item 10: ticking the box is not an error; its title follows it; the memory
    estimates, which the cloud does not change, stay."""
    from app.settings_dialog import SettingsDialog

    dialog = SettingsDialog(EngineSettings(), settings_file=tmp_path / "settings.toml")
    qtbot.addWidget(dialog)
    budget, recall = dialog.cache.budget_info.text(), dialog.recall.info.text()
    off = dialog.cloud.title()
    assert budget and recall and "off: nothing leaves this computer" in off
    dialog.cloud.setChecked(True)
    assert dialog.error.text() == "To use the cloud fallback, enter the endpoint URL and the model name."
    assert "C62828" not in dialog.error.styleSheet(), "a hint, not a red error"
    assert "nothing leaves" not in dialog.cloud.title() and "on:" in dialog.cloud.title()
    assert (dialog.cache.budget_info.text(), dialog.recall.info.text()) == (budget, recall)
    dialog.cloud.url.setText("http://127.0.0.1:9/v1")
    assert dialog.error.text() == "To use the cloud fallback, enter the model name."
    dialog.cloud.model.setText("tiny-cloud")
    assert dialog.error.text() == ""
    dialog.cloud.model.setText("")
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()  # still incomplete: refused, in red
    assert not dialog.saved and dialog.error.text() and "C62828" in dialog.error.styleSheet()
    dialog.cloud.setChecked(False)
    assert dialog.error.text() == "" and dialog.cloud.title() == off


def test_the_header_says_where_a_read_stopped_earlier_goes_on():
    """A document whose earlier whole read kept its chunks (engine.read_checkpoint): the header says
    the read goes on from there, and the time it gives is the rest's."""
    from app.document_header import whole_read_text
    from engine.kvcache.cache import MemoryBreakdown
    from engine.open_document import OpenReport

    report = OpenReport(title="b.txt", kind="text", document_tokens=1000, prefix_hit=False, position_mode="original",
                        seconds=0.1, prefill_seconds=0.0, prefill_tokens_per_s=0.0, kv=MemoryBreakdown(),
                        full_fp16_bytes=0, unread=True)
    assert "going on" not in whole_read_text(report)
    report.read_from = 400
    assert "going on from 40% where it stopped" in whole_read_text(report)
