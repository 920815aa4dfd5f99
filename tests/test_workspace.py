"""The engine facade (`engine.workspace`): what a settings change implies, the budget after an
out-of-memory, answers as library records, and a real workspace on the embedded model with a real
prefix store on disk."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.answer import Answer, CloudReply, Source
from engine.cloud.client import CloudUsage
from engine.errors import HalamanError
from engine.kvcache.recall import RecallStats
from engine.progress import Phase
from engine.settings import CachePolicy, EngineSettings, RecallSettings
from engine.workspace import (
    MIN_BUDGET_TOKENS, ModelInfo, SettingsChange, Workspace, answer_record, lowered_budget, out_of_memory,
    prefix_store_dir,
)

SMALL = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64, chunk_tokens=256),
                       max_new_tokens=8)


# ------------------------------------------------------------------------------ pure decisions
@pytest.mark.parametrize("change,expected", [
    (dict(model="/models/other.gguf"), SettingsChange.RELOAD_MODEL),
    (dict(device="cpu", cache=SMALL.cache.replace(budget_tokens=1024)), SettingsChange.RELOAD_MODEL),  # device wins
    (dict(weights="4bit"), SettingsChange.RELOAD_MODEL),                            # weights are held another way
    (dict(cache=SMALL.cache.replace(budget_tokens=640)), SettingsChange.REOPEN_DOCUMENT),
    (dict(prefix_cache=False), SettingsChange.REOPEN_DOCUMENT),
    (dict(recall=RecallSettings(archive_bits=2)), SettingsChange.REOPEN_DOCUMENT),   # the archive is written while reading
    (dict(include_generated_files=True), SettingsChange.REOPEN_DOCUMENT),           # a folder reads other files
    (dict(recall=RecallSettings(recall_tokens=256)), SettingsChange.NOTHING),       # read at each question
    (dict(recall=RecallSettings(recall_tokens=0)), SettingsChange.REOPEN_DOCUMENT),  # recall off: another recall plan
    (dict(max_new_tokens=99, temperature=0.7, draft_tokens=8), SettingsChange.NOTHING),
    (dict(threads=1), SettingsChange.NOTHING),                                      # applied at the next read
    (dict(prefix_cache_disk_bytes=10**9), SettingsChange.NOTHING),
])
def test_what_a_settings_change_implies(change, expected):
    old = SMALL.replace(device="auto")
    result = SettingsChange.between(old, old.replace(**change))
    assert result is expected
    assert result.reopens_document == (expected is not SettingsChange.NOTHING)


def test_the_budget_halves_after_an_out_of_memory_and_stays_a_valid_policy():
    settings = EngineSettings(cache=CachePolicy(budget_tokens=2048, sink_tokens=4, window_tokens=1024, residual_tokens=512))
    lower = lowered_budget(settings)
    assert lower.cache.budget_tokens == 1024 and lower.cache.window_tokens == 256 and lower.cache.residual_tokens == 256
    assert lower.cache.kv_bits == settings.cache.kv_bits and lower.model == settings.model  # nothing else changes
    budgets = []
    while not budgets or budgets[-1] > MIN_BUDGET_TOKENS:
        lower.validate()  # every step is a policy the session accepts
        budgets.append(lower.cache.budget_tokens)
        lower = lowered_budget(lower)
    assert budgets == [1024, 512, 256, 128, 64]
    assert lowered_budget(lower).cache == lower.cache  # the floor


def test_out_of_memory_is_told_apart_from_other_errors():
    assert out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory")) == "GPU"
    assert out_of_memory(MemoryError()) == "system"
    assert out_of_memory(RuntimeError("CUDA error: device-side assert")) is None


def _profile():
    from engine.estimate import KNOWN_SHAPES

    return KNOWN_SHAPES["smollm2-135m"]


def test_a_cloud_answer_becomes_a_record_with_its_provenance_and_no_local_fields():
    reply = CloudReply(endpoint="https://api.example.com/v1", model="served-model", reason="low confidence",
                       usage=CloudUsage(prompt_tokens=90, completion_tokens=17, total_tokens=107))
    answer = Answer.from_cloud("q?", "It is Tuesday.", prompt_tokens=90, time_to_first_token_s=0.4,
                               decode_tokens_per_s=20.0, stop_reason="end", reply=reply)
    assert math.isnan(answer.mean_logprob) and answer.token_ids == [] and not answer.incomplete
    model = ModelInfo("SmolLM2", "cpu", _profile(), 10, 1.0)
    record = answer_record(answer, model=model, recall=None)
    assert (record.source, record.endpoint, record.model, record.reason) == (
        "cloud", "https://api.example.com/v1", "served-model", "low confidence")
    assert record.tokens == 17 and record.prefix_hit is None and record.state == "done"
    assert record.sources_json is None and record.recall_json is None
    unreported = answer_record(Answer.from_cloud("q?", "x", prompt_tokens=5, time_to_first_token_s=0.1,
                                                 decode_tokens_per_s=0.0, stop_reason="cancelled",
                                                 reply=CloudReply(endpoint="e", model="m", reason="user asked")),
                               model=model, recall=None)
    assert unreported.tokens is None and unreported.tokens_per_s is None and unreported.state == "cancelled"


def test_a_local_answer_becomes_a_record_with_its_recall_and_sources():
    stats = RecallStats(blocks_scored=900, blocks_recalled=804, tokens_recalled=16200, bytes_read=2304000)
    answer = Answer(question="q", text="On page 2.", token_ids=[1, 2, 3], prompt_tokens=300, time_to_first_token_s=0.3,
                    decode_tokens_per_s=3.2, prefix_hit=True, stop_reason="end", mean_logprob=-0.5, recall=stats,
                    sources=[Source("page 2", 0.6, page=2)])
    model = ModelInfo("SmolLM2", "cpu", _profile(), 10, 1.0)
    record = answer_record(answer, model=model, recall=None)
    assert (record.source, record.model, record.endpoint, record.reason) == ("local", "SmolLM2", None, None)
    assert record.tokens == 3 and record.prefix_hit == 1 and record.tokens_per_s == 3.2
    assert json.loads(record.sources_json) == [{"label": "page 2", "share": 0.6, "page": 2, "path": None, "document": None,
                                                "document_source": None, "shown": None}]
    assert json.loads(record.recall_json)["tokens_per_head"] == round(16200 / (30 * 3))  # layers x KV heads
    assert set(record.fields()) >= {"text", "state", "source", "sources_json", "recall_json"}


# ------------------------------------------------------------------------------ a real workspace
@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_workspace_opens_asks_and_acts_on_settings_changes(smol, home, tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday at 10 in room 4. The code word is PELICAN.\n")
    loads, loaded = [], []

    def factory(settings):
        loads.append(settings.model)
        return smol

    workspace = Workspace(SMALL, factory, on_model_loaded=loaded.append)
    with pytest.raises(HalamanError, match="no document is open"):
        workspace.ask_cloud("q?")
    events = []
    opened = workspace.open(str(doc), progress=events.append)
    assert loads == ["default"] and [info.label for info in loaded] == [smol.label]
    assert events[0].phase is Phase.LOADING_MODEL and any(e.phase is Phase.PREFILL for e in events)
    assert opened.path == str(doc) and opened.report.document_tokens > 20 and not opened.report.prefix_hit
    # The one prefix store, where prefix_store_dir says, holds the key the open reports.
    assert prefix_store_dir() == home / "cache" / "prefix"
    assert workspace.cached_keys() == {opened.prefix_key} and (prefix_store_dir() / "index.sqlite").exists()

    answer = workspace.ask("What is the code word?")
    assert answer.cloud is None and answer.text and answer.stop_reason in ("end", "max_tokens")
    record = workspace.answer_record(answer)
    assert record.source == "local" and record.model == smol.label and record.tokens == len(answer.token_ids)

    # The recall budget applies at the next question: the document stays open.
    assert workspace.apply_settings(SMALL.replace(recall=SMALL.recall.replace(recall_tokens=64))) is SettingsChange.NOTHING
    assert workspace.session.document is not None and workspace.ask("Which room?").text
    # A new cache policy: a new session, no document until the caller opens it again.
    bigger = SMALL.replace(cache=SMALL.cache.replace(budget_tokens=640))
    assert workspace.apply_settings(bigger) is SettingsChange.REOPEN_DOCUMENT
    with pytest.raises(HalamanError, match="no document is open"):
        workspace.ask("Which room?")
    again = workspace.open(str(doc))
    assert not again.report.prefix_hit and again.prefix_key != opened.prefix_key  # the policy is in the key
    assert workspace.cached_keys() == {opened.prefix_key, again.prefix_key}
    # A new model: unloaded now, loaded by the next call that needs it.
    assert workspace.apply_settings(bigger.replace(model="/models/other.gguf")) is SettingsChange.RELOAD_MODEL
    assert workspace.model is None and workspace.session is None and workspace.memory() is None
    workspace.ensure_model()
    assert loads == ["default", "/models/other.gguf"] and len(loaded) == 2
    workspace.shutdown()
    assert workspace.model is None


def test_workspace_goes_on_without_an_unusable_prefix_store(home):
    """A prefix folder that cannot be used gives one notice, no exception; clearing still works."""
    (home / "cache").mkdir(parents=True)
    (home / "cache" / "prefix").write_text("a file where the cache folder should be")
    workspace = Workspace(EngineSettings())
    assert workspace.prefix_store() is None and workspace.prefix_store() is None  # tried once
    assert workspace.prefix_cache_usage() == (0, 0) and workspace.clear_prefix_cache() == 0
    assert workspace.prefix_entries() is None
    [notice] = workspace.notices
    assert notice.startswith("the prefix cache cannot be used (")


def test_a_settings_change_that_reopens_nothing_keeps_a_failed_prefix_store_off(smol, home, tmp_path):
    """The store fails while the document is saved (its folder became a file); the session goes on
    without it. A new answer length needs nothing reopened and must not hand the session the failed
    store again."""
    doc = tmp_path / "notes.md"
    doc.write_text("The meeting is on Tuesday at 10 in room 4. The code word is PELICAN.\n")
    workspace = Workspace(SMALL, lambda _settings: smol)
    workspace.ensure_model()
    folder = prefix_store_dir()
    folder.rename(tmp_path / "moved")
    folder.write_text("a file where the cache folder should be")
    opened = workspace.open(str(doc))
    assert any(w.startswith("the prefix cache stopped working and is off for this session") for w in opened.report.warnings)
    assert workspace.session.store is None

    assert workspace.apply_settings(SMALL.replace(max_new_tokens=12)) is SettingsChange.NOTHING
    assert workspace.session.store is None
    assert workspace.session.settings.max_new_tokens == 12 and workspace.ask("Which room?").text
    workspace.shutdown()


def test_prefix_entries_come_most_recently_used_first_as_documented(home):
    workspace = Workspace(SMALL)
    store = workspace.prefix_store()
    first, second = "a" * 64, "b" * 64
    store.put(first, {"k": torch.zeros(4)}, {}, n_tokens=4, label="first")
    store.put(second, {"k": torch.ones(4)}, {}, n_tokens=4, label="second")
    assert [e.label for e in workspace.prefix_entries()] == ["second", "first"]
    assert store.get(first) is not None  # a hit: used last
    assert [e.label for e in workspace.prefix_entries()] == ["first", "second"]
    assert "most recently used first" in Workspace.prefix_entries.__doc__
    workspace.shutdown()
