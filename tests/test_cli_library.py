"""`halaman library add` / `list` as a user runs them: a real process, the embedded model, real
files, the app's real library file."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HALAMAN = [str(Path(sys.executable).parent / "halaman")]
if not Path(HALAMAN[0]).exists():
    HALAMAN = [sys.executable, "-m", "engine.cli"]


def run(*args, home=None):
    """`halaman ARGS` in a real process; `home`: a HALAMAN_HOME of its own (a library of just
    what the test adds), else the test session's."""
    env = dict(os.environ, **({"HALAMAN_HOME": str(home)} if home is not None else {}))
    return subprocess.run([*HALAMAN, *args], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)


def listed(paths):
    out = run("library", "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    return {row["path"]: row for row in rows if row["path"] in {str(p.resolve()) for p in paths}}


def test_add_reads_each_document_once_lists_it_and_goes_on_past_a_bad_one(tmp_path):
    launch = tmp_path / "launch.md"
    launch.write_text("# Launch\n\nThe launch window opens on 12 March. The rocket is called Kestrel.\n")
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe budget review meeting is on Tuesday at 10 in room 4.\n")
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    assert listed([launch, notes]) == {}

    first = run("library", "add", str(launch), str(empty), str(notes))
    assert first.returncode == 1, first.stderr  # one failed, the others were added
    assert "empty.pdf" in first.stderr and first.stderr.count("halaman: ") >= 1
    assert "added launch.md (text," in first.stdout and "added notes.md (text," in first.stdout
    rows = listed([launch, notes, empty])
    assert set(rows) == {str(launch.resolve()), str(notes.resolve())}
    assert {row["status"] for row in rows.values()} == {"cached"}
    assert all(row["tokens"] > 0 and row["kind"] == "text" for row in rows.values())

    again = run("library", "add", str(launch))
    assert again.returncode == 0, again.stderr
    assert "added launch.md" in again.stdout and "its saved reading is reused" in again.stdout

    launch.write_text("# Launch\n\nThe launch window moved to 19 March.\n")  # the file changed: its reading is stale
    assert listed([launch])[str(launch.resolve())]["status"] == "stale"
    plain = run("library", "list")
    assert any(line.startswith("stale") and str(launch.resolve()) in line for line in plain.stdout.splitlines())


def test_ask_library_answers_from_the_document_that_holds_the_answer_and_cites_it(tmp_path):
    home = tmp_path / "home"  # a library of just these two documents
    observatory = tmp_path / "observatory-log.md"
    observatory.write_text("# Observatory log\n\nThe telescope dome was repaired in May. The combination of the "
                           "observatory safe is 48213. The night guard is called Ilse.\n")
    harbour = tmp_path / "harbour-report.md"
    harbour.write_text("# Harbour report\n\nThe harbour master counted 41 fishing boats before the storm. "
                       "The lighthouse lamp was replaced in June.\n")
    added = run("library", "add", str(observatory), str(harbour), home=home)
    assert added.returncode == 0, added.stderr

    out = run("ask", "--library", "What is the combination of the observatory safe?", "--json", "--max-new-tokens", "16", home=home)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["documents_read"][0]["title"] == "observatory-log.md"
    assert result["sources"][0]["document"] == "observatory-log.md" and result["sources"][0]["share"] > 0
    assert result["sources"][0]["file"] == str(observatory.resolve())
    assert "48213" in result["answer"]
    assert result["library"]["documents"] == 2 and result["timings"]["ttft_s"] > 0

    harbour.write_text(harbour.read_text() + "The pier was painted blue in August.\n")  # its saved reading is stale now
    plain = run("ask", "--library", "How many fishing boats did the harbour master count?", "--max-new-tokens", "16",
                home=home)
    assert plain.returncode == 0, plain.stderr
    assert "[harbour-report.md]" in plain.stdout.split("--- report ---")[1]
    assert "harbour-report.md changed since its reading was saved" in plain.stderr
    assert "observatory-log.md changed" not in plain.stderr

    both = run("ask", "--library", str(harbour), "How many boats?", home=home)
    assert both.returncode == 2 and "unrecognized arguments" in both.stderr


def test_options_may_come_between_path_and_question_and_library_takes_only_a_question():
    """The trial: `ask doc.txt --max-new-tokens 30 "Q"` stopped parsing when QUESTION became optional."""
    from engine.cli import build_parser, parser_argv

    parse = lambda *argv: build_parser().parse_args(parser_argv(list(argv)))  # noqa: E731
    args = parse("ask", "doc.txt", "--max-new-tokens", "30", "Who built it?")
    assert (args.path, args.question, args.max_new_tokens, args.library) == ("doc.txt", "Who built it?", 30, False)
    args = parse("ask", "--library", "--max-new-tokens", "30", "Who built it?")
    assert (args.question, args.library) == ("Who built it?", True)
    assert parse("ask", "--password", "pw", "a.pdf", "Q?").password == "pw"


def test_a_library_source_names_a_single_file_once():
    from engine.answer import Source
    from engine.cli_library import source_text

    assert source_text(Source("page 5", 0.5, page=5, document="Think Python")) == "[Think Python, page 5]"
    assert source_text(Source("notes.md", 1.0, document="notes.md")) == "[notes.md]"


def test_list_says_how_much_of_a_document_a_stopped_read_kept(tmp_path, monkeypatch):
    """A stopped read's checkpoint (330 of 1,000 tokens): `library list` says "read 33 %" (and
    `--json` gives read_share 0.33), as the window's list does, not "not cached"."""
    from engine.library import Library
    from engine.prefix_store import PrefixStore, checkpoint_key
    from engine.workspace import prefix_store_dir

    home = tmp_path / "home"
    monkeypatch.setenv("HALAMAN_HOME", str(home))
    notes = tmp_path / "notes.txt"
    notes.write_text("The budget review meeting is on Tuesday at 10 in room 4.\n")
    library = Library(interrupt_streaming=False)
    try:
        library.upsert_document(path=str(notes), title="notes.txt", kind="text", tokens=1000, prefix_key="a" * 64)
    finally:
        library.close()
    store = PrefixStore(prefix_store_dir(), disk_budget_bytes=1 << 30)
    store.put(checkpoint_key("a" * 64), {}, {}, n_tokens=330, label="notes.txt (read in part: 330 of 1,000 tokens)")

    plain = run("library", "list", home=home)
    assert plain.returncode == 0, plain.stderr
    line = next(line for line in plain.stdout.splitlines() if str(notes) in line)
    assert line.startswith("read 33 %") and "not cached" not in line
    rows = [json.loads(line) for line in run("library", "list", "--json", home=home).stdout.splitlines()]
    assert [row["read_share"] for row in rows] == [0.33] and rows[0]["status"] == "not cached"
