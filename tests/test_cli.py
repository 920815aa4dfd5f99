"""The `halaman` command as a user runs it: a real process, real files."""

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HALAMAN = [str(Path(sys.executable).parent / "halaman")]
if not Path(HALAMAN[0]).exists():
    HALAMAN = [sys.executable, "-m", "engine.cli"]


def run(*args, timeout=600):
    return subprocess.run([*HALAMAN, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ), cwd=REPO)


def test_estimate_llama_3b_headline():
    out = run("estimate", "--model", "llama-3.2-3b", "--tokens", "131072")
    assert out.returncode == 0, out.stderr
    assert "114,688 bytes/token" in out.stdout
    assert "15,032,385,536 bytes (14.0 GiB)" in out.stdout  # 114,688 × 131,072


def test_estimate_default_model_reads_its_config():
    out = run("estimate", "--tokens", "8192", "--budget", "2048", "--window", "512")
    assert out.returncode == 0, out.stderr
    assert "L=30 layers, H_kv=3 KV heads, D=64" in out.stdout
    assert "23,040 bytes/token" in out.stdout  # 2·30·3·64·2


def test_ask_twice_second_is_a_prefix_cache_hit(tmp_path):
    doc = tmp_path / f"note-{uuid.uuid4().hex}.md"
    doc.write_text("# Release notes\n\nVersion 2.4 adds a dark theme and fixes the export button.\n")
    args = ("ask", str(doc), "What does version 2.4 add?", "--max-new-tokens", "12", "--budget", "512", "--window", "128")
    first = run(*args, "--read", "first")  # read whole before answering, and saved
    assert first.returncode == 0, first.stderr
    assert "prefix cache    miss (prefill" in first.stdout
    assert "KV cache held" in first.stdout and "TTFT" in first.stdout and "decode" in first.stdout
    second = run(*args)  # the default reads nothing more: the saved reading is found
    assert second.returncode == 0, second.stderr
    assert "prefix cache    hit" in second.stdout
    answer = lambda out: out.stdout.split("--- report ---")[0]  # noqa: E731
    assert answer(first) == answer(second)
    listing = run("cache", "list")
    assert doc.stem in listing.stdout
    # Both questions joined the app's history, which exports them with their answers (issue 32).
    history = run("history", "export", str(doc))
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("**Question:** What does version 2.4 add?") == 2
    assert answer(first).strip().splitlines()[0].strip()[:20] in history.stdout
    unrecorded = run(*args, "--no-history")
    assert unrecorded.returncode == 0, unrecorded.stderr
    again = run("history", "export", str(doc)).stdout
    assert again.splitlines()[3:] == history.stdout.splitlines()[3:]  # all but the time of export


def test_ask_about_this_repository(tmp_path):
    # Two of this repository's own files (the whole engine/kvcache took minutes on a busy CPU).
    folder = tmp_path / "kvcache"
    folder.mkdir()
    for name in ("quant.py", "policy.py"):
        (folder / name).write_text((REPO / "engine" / "kvcache" / name).read_text())
    out = run("ask", str(folder), "Which file quantizes keys and values?",
              "--max-new-tokens", "24", "--budget", "1024", "--window", "256", "--no-prefix-cache")
    assert out.returncode == 0, out.stderr
    assert "(repo," in out.stdout and "prefix cache    miss" in out.stdout and "(disabled)" in out.stdout
    # Without a prefix store the archive lives for the session: recall still runs.
    assert "recall          " in out.stdout and "recall          off" not in out.stdout


@pytest.fixture
def slow_reads():
    """This machine's measured rate for the default model on one CPU thread set to 0.5 tokens/s, so
    a short document is a long read; the rates file of the test home is restored afterwards."""
    from engine.models.source import resolve
    from engine.read_time import RateKey, rates_path, record_rate

    path = rates_path()
    before = path.read_bytes() if path.exists() else None
    path.unlink(missing_ok=True)
    assert record_rate(RateKey(resolve("default").label, "cpu", "float32", 1), 2048, 4096.0)
    yield
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(before)


def test_a_long_read_is_announced_and_goes_on(tmp_path, slow_reads):
    folder = tmp_path / "kvcache"
    folder.mkdir()
    (folder / "quant.py").write_text((REPO / "engine" / "kvcache" / "quant.py").read_text()[:2000])
    out = run("ask", str(folder), "What does this file do?", "--device", "cpu", "--weights", "full", "--threads", "1",
              "--max-new-tokens", "4", "--budget", "1024", "--window", "256", "--no-prefix-cache", "--read", "first")
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stderr.splitlines() if line.startswith("halaman: ")]
    assert line.endswith(" on this computer (0.5 tokens/s measured here) — Ctrl-C stops; ask about a subfolder to read less."), line
    tokens = int(line.removeprefix("halaman: ").split(" tokens:")[0].replace(",", ""))
    assert f"(repo, {tokens:,} tokens" in out.stdout  # the report's exact count
    assert "prefix cache    miss" in out.stdout  # it went on


@pytest.mark.parametrize("args,message", [
    (("ask", "/no/such/file.pdf", "q"), "/no/such/file.pdf"),
    (("ask", "README.md", "q", "--budget", "100"), "sink + window"),
    (("ask", "README.md", "q", "--model", "./missing.gguf"), "does not exist"),
])
def test_bad_input_is_one_line_and_exit_1(args, message):
    out = run(*args)
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.startswith("halaman:")]
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in out.stderr


def test_a_bad_document_is_reported_before_the_model_is_loaded(tmp_path):
    # The model path does not exist either: whichever error comes first tells what was read first.
    fake = tmp_path / "report.pdf"
    fake.write_text("# not a PDF, only named like one\n")
    out = run("ask", str(fake), "q", "--model", "./missing.gguf")
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.startswith("halaman:")]
    assert len(lines) == 1 and "not a PDF" in lines[0], out.stderr
    assert "Loading" not in out.stderr


def test_an_empty_question_is_refused_before_the_model_loads():
    out = run("ask", "resources/samples/kv-cache-primer.md", "   ", timeout=120)
    assert out.returncode == 1 and "the question is empty" in out.stderr
    assert "Loading" not in out.stderr  # said before the model load, not after it


def test_recall_line_says_why_recall_is_off():
    from engine.cli import recall_line
    from engine.recall_plan import RecallPlan, RecallSource

    missing = "its archive cannot be written (disk full)"
    assert recall_line(None, RecallPlan(RecallSource.WHOLE, "")) == "off (the cache keeps the whole document: nothing to recall)"
    assert recall_line(None, RecallPlan(RecallSource.OFF, "", missing)) == "off (no archive: see the warning above)"
    assert recall_line(None, RecallPlan(RecallSource.OFF, "recall is off in the settings")) == "off"
    assert recall_line(None, None) == "off"
    # A document that re-reads its spans, asked a question that chose none: not "kept whole".
    reread = recall_line(None, RecallPlan(RecallSource.REREAD, "", missing))
    assert reread.startswith("off for this question") and "whole" not in reread


def test_show_spans_prints_the_attended_needle_sentence_first(tmp_path):
    # The 24-page book of tests/test_span_recall.py as one text file: recall finds the needle's
    # span, and the first attended passage printed is the sentence that holds it.
    from test_span_recall import COMBINATION, NEEDLE_PAGE, QUESTION, book

    doc = tmp_path / f"book-{uuid.uuid4().hex}.txt"
    doc.write_text("\n\n".join(segment.text for segment in book().segments) + "\n")
    out = run("ask", str(doc), QUESTION, "--show-spans", "--device", "cpu", "--weights", "full", "--threads", "1",
              "--max-new-tokens", "16", "--budget", "256", "--window", "64", "--residual", "64", "--chunk", "256",
              "--recall-tokens", "512", "--no-prefix-cache")
    assert out.returncode == 0, out.stderr
    spans = out.stdout.split("attended spans  ")[1].splitlines()
    assert f"the combination of the observatory safe is {COMBINATION}" in spans[0], out.stdout
    # one page a line, a blank line between two: the needle's page is the file's line 2k - 1
    assert spans[0].startswith(f"{doc.name}, line {2 * NEEDLE_PAGE - 1}, characters ") and " %): \"" in spans[0], spans[0]


def test_the_prefill_bar_shows_the_sessions_rate_and_time_left_not_tqdms(capsys):
    # The first event comes after the first chunk is done: tqdm's own clock would count it as free.
    import re

    from engine.cli_report import ProgressBar
    from engine.progress import Phase, Progress

    bar = ProgressBar()
    bar.update(Progress(Phase.PREFILL, 512, 2048, "tokens", tokens_per_s=364.0, eta_s=4.2))
    bar.update(Progress(Phase.PREFILL, 1024, 2048, "tokens", tokens_per_s=351.0, eta_s=2.9))
    bar.close()
    err = capsys.readouterr().err
    assert "351 tokens/s, 3 s left" in err
    assert set(re.findall(r"([\d.,]+[kMG]?|\?) ?tokens/s", err)) <= {"364", "351"}, err
    assert ", , " not in err


def test_an_answer_the_history_cannot_keep_is_still_answered(tmp_path):
    # The history's folder cannot be made (a file stands where it goes): `ask` answers and says the
    # answer was not kept, instead of failing after the answer.
    home = tmp_path / "home"
    home.mkdir()
    (home / "data").write_text("not a folder")
    doc = tmp_path / "note.md"
    doc.write_text("# Note\n\nThe meeting is on Tuesday.\n")
    out = subprocess.run([*HALAMAN, "ask", str(doc), "When is the meeting?", "--max-new-tokens", "8"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "HALAMAN_HOME": str(home)}, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "--- report ---" in out.stdout and "the answer was not kept in the history" in out.stderr


def test_history_export_of_a_path_that_does_not_exist_says_so_not_no_conversation(tmp_path):
    # Issue 32: a mistyped path read "no conversation about it", as if the document were there.
    missing = run("history", "export", str(tmp_path / "nonexistent"))
    assert missing.returncode == 1
    [line] = [line for line in missing.stderr.splitlines() if line.startswith("halaman:")]
    assert "does not exist" in line and "no conversation" not in line, line
    never_asked = tmp_path / "never-asked.md"
    never_asked.write_text("# Never asked about\n")
    unasked = run("history", "export", str(never_asked))
    assert unasked.returncode == 1 and "no conversation" in unasked.stderr and "does not exist" not in unasked.stderr


def _cache_home(tmp_path: Path) -> tuple[dict, Path]:
    """A HALAMAN_HOME whose prefix store holds two real entries: (environment, store folder)."""
    import torch

    from engine.prefix_store import PrefixStore

    env = {**os.environ, "HALAMAN_HOME": str(tmp_path / "home")}
    root = tmp_path / "home" / "cache" / "prefix"
    store = PrefixStore(root, disk_budget_bytes=10**8)
    for i in range(2):
        store.put(f"{i:064x}", {"x": torch.zeros(64, 64)}, {}, n_tokens=5, label=f"doc {i}")
    store.close()
    return env, root


def _entries(root: Path) -> int:
    return sum(1 for p in root.iterdir() if p.name.endswith(".safetensors"))


def test_cache_clear_without_a_terminal_refuses_unless_yes(tmp_path):
    # Issue 32: `cache clear` deleted every saved read without asking.
    env, root = _cache_home(tmp_path)
    refused = subprocess.run([*HALAMAN, "cache", "clear"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 1 and _entries(root) == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("halaman: ") and "--yes" in line, line
    cleared = subprocess.run([*HALAMAN, "cache", "clear", "--yes"], capture_output=True, text=True, timeout=120, env=env,
                             cwd=REPO, stdin=subprocess.DEVNULL)
    assert cleared.returncode == 0, cleared.stderr
    assert "removed 2 prefix cache entries" in cleared.stdout and _entries(root) == 0


@pytest.mark.parametrize("reply, kept", [("n\n", 2), ("\n", 2), ("y\n", 0)])
def test_cache_clear_on_a_terminal_asks_first_saying_what_and_how_many_bytes(tmp_path, reply, kept):
    import pty

    env, root = _cache_home(tmp_path)
    size = sum(p.stat().st_size for p in root.iterdir() if p.name.endswith(".safetensors"))  # not the index
    master, terminal = pty.openpty()
    try:
        os.write(master, reply.encode())
        out = subprocess.run([*HALAMAN, "cache", "clear"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                             stdin=terminal)
    finally:
        os.close(master)
        os.close(terminal)
    assert out.returncode == 0, out.stderr
    assert f"2 entries, {size:,} bytes" in out.stdout and str(root) in out.stdout, out.stdout
    assert _entries(root) == kept
    assert ("removed 2 prefix cache entries" in out.stdout) == (kept == 0)


def _long_note(path: Path) -> Path:
    """A text file of some 2,000 tokens: more than a 512-token budget keeps whole, so it is read
    index first unless asked otherwise."""
    path.write_text("# Field notes\n\n" + "".join(
        f"Day {day}: the crew counted {day * 7} herons at pond {day % 5} and logged the water at {10 + day % 9} degrees.\n"
        for day in range(1, 90)), encoding="utf-8")
    return path


@pytest.mark.parametrize("when", ["after", "first"])
def test_a_read_asked_for_says_its_tokens_and_time_before_it_starts(tmp_path, when):
    # Issue 32: `--read after` and `--read first` began a read of minutes with no word of how long.
    doc = _long_note(tmp_path / f"notes-{uuid.uuid4().hex}.md")
    out = run("ask", str(doc), "How many herons on day 3?", "--max-new-tokens", "4", "--budget", "512", "--window", "128",
              "--read", when)
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stderr.splitlines() if "Ctrl-C stops" in line]
    found = re.fullmatch(r"halaman: (?:reading the whole document for the next questions, )?([\d,]+) tokens: about "
                         r"\S.* on this computer \((?:[\d,.]+ tokens/s measured here|a guess: .+)\) — Ctrl-C stops.*\.", line)
    assert found, line
    assert f"(text, {found.group(1)} tokens" in out.stdout  # the report's exact count: the whole read
    if when == "after":  # said before the read, whose end is the line after it
        assert out.stderr.index(line) < out.stderr.index("read            ")
    else:
        assert "prefix cache    miss (prefill" in out.stdout


def test_a_file_name_over_255_bytes_is_one_line_not_a_traceback(tmp_path, capsys):
    """Issue 45 minor: `find` and `ask` on such a name ended in an OSError traceback (Path.exists)."""
    from engine.cli import main

    name = str(tmp_path / ("minutes-" * 40 + ".txt"))
    for argv in (["find", name, "What?"], ["ask", name, "What?"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "file name is too long" in err and "rename it shorter" in err and "…" in err
