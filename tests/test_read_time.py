"""How long a read will take, said before it starts: the rate store, the guess, and the workspace's
`before_prefill` question on the real default model."""

import json

import pytest

from engine import read_time
from engine.errors import Cancelled, HalamanError
from engine.read_time import (
    REFERENCE_PARAMETERS, RateKey, ReadPlan, guessed_rate, measured_rate, plan_read, rates_path, record_rate,
)
from engine.settings import CachePolicy, EngineSettings
from engine.workspace import Workspace

KEY = RateKey("SmolLM2-135M-Instruct (embedded, Q4_1)", "cpu", "float32", 2)


# ------------------------------------------------------------------------------ the rate store
def test_a_recorded_rate_comes_back_and_plans_the_next_read(tmp_path):
    path = tmp_path / "read_speed.json"
    assert measured_rate(KEY, path) is None and not plan_read(10_000, KEY, REFERENCE_PARAMETERS, path).measured
    assert record_rate(KEY, 4096, 20.0, path)
    assert measured_rate(KEY, path) == pytest.approx(204.8)
    plan = plan_read(102_400, KEY, REFERENCE_PARAMETERS, path)
    assert plan == ReadPlan(tokens=102_400, tokens_per_s=pytest.approx(204.8), seconds=pytest.approx(500.0), measured=True, threads=2)
    assert [p.name for p in tmp_path.iterdir()] == ["read_speed.json"]  # the temp file was renamed
    assert json.loads(path.read_text())["rates"][0]["threads"] == 2


def test_the_median_of_the_last_three_reads_is_used(tmp_path):
    path = tmp_path / "read_speed.json"
    for rate in (100.0, 110.0, 120.0):
        record_rate(KEY, 2048, 2048 / rate, path)
    assert measured_rate(KEY, path) == pytest.approx(110.0)
    record_rate(KEY, 2048, 2048 / 1000.0, path)  # one odd read (cores suddenly free) does not decide alone
    assert measured_rate(KEY, path) == pytest.approx(120.0)  # 110, 120, 1000: the 100 was dropped


def test_short_reads_and_impossible_times_are_not_recorded(tmp_path):
    path = tmp_path / "read_speed.json"
    assert not record_rate(KEY, read_time.MIN_MEASURED_TOKENS - 1, 1.0, path)
    assert not record_rate(KEY, 4096, 0.0, path) and not record_rate(KEY, 4096, float("nan"), path)
    assert not path.exists()
    assert record_rate(KEY, read_time.MIN_MEASURED_TOKENS, 1.0, path)
    assert measured_rate(KEY, path) == read_time.MIN_MEASURED_TOKENS


def test_each_model_device_weights_and_thread_count_has_its_own_rate(tmp_path):
    path = tmp_path / "read_speed.json"
    record_rate(KEY, 3000, 10.0, path)
    others = [RateKey("other model", "cpu", "float32", 2), RateKey(KEY.model, "cuda", "float32", 2),
              RateKey(KEY.model, "cpu", "4-bit NF4", 2), RateKey(KEY.model, "cpu", "float32", 1)]
    assert [measured_rate(key, path) for key in others] == [None] * 4
    record_rate(others[3], 3000, 30.0, path)
    assert measured_rate(KEY, path) == 300.0 and measured_rate(others[3], path) == 100.0
    # The least recently measured keys go first when the file is full.
    for threads in range(3, 3 + read_time.MAX_KEYS):
        record_rate(RateKey(KEY.model, "cpu", "float32", threads), 3000, 10.0, path)
    assert measured_rate(KEY, path) is None and measured_rate(RateKey(KEY.model, "cpu", "float32", 3), path) == 300.0


@pytest.mark.parametrize("content", [
    "{not json", "\xff\xfe", "[]", '{"format": 99, "rates": []}', '{"format": 1, "rates": {"a": 1}}',
    '{"format": 1, "rates": [{"model": "m"}, 7, {"model": "SmolLM2-135M-Instruct (embedded, Q4_1)", "device": "cpu", '
    '"weights": "float32", "threads": "two", "tokens_per_s": [100]}]}',
])
def test_a_damaged_file_is_ignored_and_replaced(tmp_path, content):
    path = tmp_path / "read_speed.json"
    path.write_text(content, encoding="latin-1")
    assert measured_rate(KEY, path) is None
    assert not plan_read(5000, KEY, REFERENCE_PARAMETERS, path).measured
    assert record_rate(KEY, 4000, 10.0, path)
    assert measured_rate(KEY, path) == 400.0


def test_bad_values_in_an_entry_are_skipped(tmp_path):
    path = tmp_path / "read_speed.json"
    entry = {"model": KEY.model, "device": "cpu", "weights": "float32", "threads": 2,
             "tokens_per_s": [-5, 0, True, "fast", 150.0]}
    path.write_text(json.dumps({"format": 1, "rates": [entry]}))
    assert measured_rate(KEY, path) == 150.0


def test_a_file_that_cannot_be_written_is_no_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert not record_rate(KEY, 4096, 10.0, blocker / "read_speed.json")
    assert measured_rate(KEY, blocker / "read_speed.json") is None


def test_the_rates_live_in_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))
    assert rates_path() == tmp_path / "cache" / "read_speed.json"
    assert record_rate(KEY, 4096, 16.0) and measured_rate(KEY) == 256.0


# ------------------------------------------------------------------------------ the guess and the plan
def test_the_guess_scales_with_the_model_size():
    assert guessed_rate("cpu", REFERENCE_PARAMETERS) == 144.0  # docs/BENCHMARKS.md 5a
    assert guessed_rate("cpu", 10 * REFERENCE_PARAMETERS) == pytest.approx(14.4)
    assert guessed_rate("cuda", REFERENCE_PARAMETERS) == 2000.0
    assert guessed_rate("cuda", REFERENCE_PARAMETERS // 2) == pytest.approx(4000.0, rel=1e-6)
    assert guessed_rate("mps", REFERENCE_PARAMETERS) == 144.0  # an unknown device: the slower guess
    assert guessed_rate("cpu", 0) == 144.0                      # size unknown: the embedded model's


def test_a_plan_says_how_long_and_where_its_rate_comes_from(tmp_path):
    flask = ReadPlan(tokens=520_143, tokens_per_s=144.0, seconds=520_143 / 144.0, measured=True)
    assert flask.describe() == "520,143 tokens: about 1 h 00 min on this computer (144 tokens/s measured here)"
    guess = plan_read(520_143, KEY, 10 * REFERENCE_PARAMETERS, tmp_path / "none.json", others_cores=0.0)
    assert guess.seconds == pytest.approx(520_143 / 14.4)
    assert guess.describe() == ("520,143 tokens: about 10 h 02 min on this computer "
                                "(a guess: no read of this model measured yet on this computer with 2 threads)")
    assert ReadPlan(86_400, 144.0, read_time.LONG_READ_S, False).is_long
    assert "(7.5 tokens/s measured here)" in ReadPlan(4500, 7.5, 600.0, True).describe()  # a slow rate is not "0"
    assert not ReadPlan(86_255, 144.0, read_time.LONG_READ_S - 1, False).is_long


# ------------------------------------------------------------------------------ the workspace asks first
SMALL = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64, chunk_tokens=256),
                       max_new_tokens=8, threads=1)  # one thread: the same rate key at every open


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_long_read_is_asked_about_first_and_its_rate_is_kept(smol, home, tmp_path, monkeypatch):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday at 10 in room 4. The code word is PELICAN.\n" * 8)
    other = tmp_path / "other.md"
    other.write_text("# Other\n\nThe train leaves at 7 from platform 2.\n" * 8)
    workspace = Workspace(SMALL, lambda _settings: smol)
    plans: list[ReadPlan] = []
    answers = []

    def ask(plan: ReadPlan) -> bool:
        plans.append(plan)
        return answers.pop(0)

    monkeypatch.setattr(read_time, "LONG_READ_S", 0.0)  # every read counts as long

    # Declined: nothing is read, nothing stored, no document open.
    answers.append(False)
    with pytest.raises(Cancelled, match=r"^Reading notes\.md was not started: \d+ tokens: about"):
        workspace.open(str(doc), before_prefill=ask)
    assert len(plans) == 1 and not plans[0].measured
    assert plans[0].tokens_per_s == pytest.approx(guessed_rate("cpu", smol.parameters) * plans[0].busy_share)
    assert workspace.session.document is None and workspace.cached_keys() == set()
    with pytest.raises(HalamanError, match="no document is open"):
        workspace.ask("What is the code word?")

    # Accepted: read, with the exact token count asked about; its rate is recorded.
    monkeypatch.setattr(read_time, "MIN_MEASURED_TOKENS", 1)  # the document is far shorter than 2,048 tokens
    answers.append(True)
    report = workspace.open(str(doc), before_prefill=ask).report
    assert len(plans) == 2 and plans[1].tokens == plans[0].tokens == report.document_tokens
    assert not report.prefix_hit and workspace.ask("What is the code word?").token_ids
    key = RateKey(smol.label, "cpu", smol.reading_label, report.threads)
    assert measured_rate(key) == pytest.approx(report.prefill_tokens_per_s)
    assert rates_path() == home / "cache" / "read_speed.json"

    # A prefix-cache hit reads nothing: nobody is asked.
    assert workspace.open(str(doc), before_prefill=ask).report.prefix_hit
    assert len(plans) == 2

    # The next read is planned with the rate measured here.
    answers.append(False)
    with pytest.raises(Cancelled, match="measured here"):
        workspace.open(str(other), before_prefill=ask)
    assert plans[2].measured and plans[2].tokens_per_s == pytest.approx(report.prefill_tokens_per_s)

    # A read shorter than LONG_READ_S starts without a question.
    monkeypatch.setattr(read_time, "LONG_READ_S", 600.0)
    assert not workspace.open(str(other), before_prefill=ask).report.prefix_hit
    assert len(plans) == 3


def test_a_model_read_unpacked_keeps_its_rates_apart_from_the_reading_copys(smol, home, tmp_path, monkeypatch):
    """A model read without the reading copy on a CPU with AVX-512 BF16 reads ~1.6x slower than with
    it: its measured rate goes under its own key, and a rate kept for the copy never plans it."""
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday at 10 in room 4. The code word is PELICAN.\n" * 8)
    monkeypatch.setattr(read_time, "MIN_MEASURED_TOKENS", 1)
    monkeypatch.setattr(read_time, "LONG_READ_S", 0.0)  # every read is planned aloud
    monkeypatch.setattr(smol, "reading", "unpacked to bfloat16")
    with_copy = RateKey(smol.label, "cpu", smol.weights_label, SMALL.threads)
    record_rate(with_copy, 4096, 0.001)  # a copy's rate, absurdly fast: it must not be the plan's
    plans: list[ReadPlan] = []
    workspace = Workspace(SMALL, lambda _settings: smol)
    report = workspace.open(str(doc), before_prefill=lambda plan: plans.append(plan) or True).report
    assert plans and not plans[0].measured
    unpacked = RateKey(smol.label, "cpu", f"{smol.weights_label}, unpacked to bfloat16", report.threads)
    assert measured_rate(unpacked) == pytest.approx(report.prefill_tokens_per_s)
    assert measured_rate(with_copy) == pytest.approx(4096 / 0.001)


def test_a_guess_on_a_busy_machine_counts_the_processor_other_programs_take(tmp_path):
    """Issue 45: on a busy machine the first plan said "about 1 h 00 min" for a read that then
    showed "7 h 38 min left": the guess is an idle machine's. Other programs keeping both cores
    busy leave 2 threads 2 / (2 + 2) of the processor: twice as long, and the plan says why."""
    from engine.read_time import cpu_share

    assert cpu_share(2, 0.0, 2) == 1.0 and cpu_share(2, 2.0, 2) == 0.5 and cpu_share(1, 7.5, 2) == pytest.approx(2 / 8.5)
    assert cpu_share(0, 7.5, 2) == 1.0  # a GPU read
    idle = plan_read(520_143, KEY, 10 * REFERENCE_PARAMETERS, tmp_path / "none.json", others_cores=0.0)
    busy = plan_read(520_143, KEY, 10 * REFERENCE_PARAMETERS, tmp_path / "none.json", others_cores=2.0)
    assert busy.seconds == pytest.approx(2 * idle.seconds) and busy.busy_share == 0.5
    assert busy.describe().endswith("other programs are using the processor now: about 2.0× longer)")
    assert record_rate(KEY, 4096, 20.0, tmp_path / "rates.json")  # a measured rate was measured under load already
    measured = plan_read(102_400, KEY, REFERENCE_PARAMETERS, tmp_path / "rates.json", others_cores=2.0)
    assert measured.seconds == pytest.approx(500.0) and measured.busy_share == 1.0


def test_other_programs_cores_are_measured_without_this_process(tmp_path):
    """`others_busy_cores` counts what other processes keep busy (a child process spinning)."""
    import subprocess
    import sys
    import time

    from engine.cpu_load import others_busy_cores

    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.monotonic()\nwhile time.monotonic()-t<3: pass"])
    try:
        time.sleep(0.3)
        assert others_busy_cores(0.5) >= 0.7, "a process spinning one core is other work"
    finally:
        child.kill()
        child.wait()
