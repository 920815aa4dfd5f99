"""A file's lines are named by the file's own numbers, not by the lines of its text as read (runs
of blank lines collapsed, leading blank lines gone): in `halaman ask --show-spans` and in the
source pane's margin (issue 32, item 5)."""

from __future__ import annotations

from engine.answer import Answer, StopReason
from engine.attended import AttendedSpan
from engine.cli import attended_spans_text
from engine.documents import load_document

NEEDLE = "    return 'the observatory safe is 48213'"
LINES = ["", "", "import os", "", "", "", "", "def first():", "    return 1   ", "", "", "", "", "def target():", NEEDLE, ""]
NEEDLE_ON_DISK = LINES.index(NEEDLE) + 1


def write_source(tmp_path, newline: str = "\n"):
    path = tmp_path / "app.py"
    path.write_bytes(newline.join(LINES).encode("utf-8"))
    return path


def test_each_line_as_read_maps_to_its_own_line_on_disk(tmp_path):
    from engine.documents.lines import file_line_numbers

    for newline in ("\n", "\r\n"):
        path = write_source(tmp_path, newline)
        text = load_document(path).segments[0].text
        shown = text.split("\n")
        assert shown.index(NEEDLE) + 1 < NEEDLE_ON_DISK, "as read, the runs of blank lines are collapsed"
        numbers = file_line_numbers(path, text)
        assert numbers is not None and len(numbers) == len(shown)
        assert numbers[shown.index(NEEDLE)] == NEEDLE_ON_DISK
        assert all(LINES[number - 1].strip() == line.strip() for line, number in zip(shown, numbers, strict=True))
        assert numbers == sorted(set(numbers))


def test_text_that_is_not_the_files_lines_gets_no_numbers(tmp_path):
    from engine.documents.lines import align_lines, file_line_numbers

    path = write_source(tmp_path)
    assert align_lines("def target():\nsomething the file never held", path.read_text()) is None
    assert file_line_numbers(tmp_path / "gone.py", "x") is None


def test_show_spans_names_the_files_own_line(tmp_path):
    path = write_source(tmp_path)
    document = load_document(path)
    segment = document.segments[0]
    start = segment.text.index(NEEDLE.strip())
    span = AttendedSpan(0, segment.label, None, segment.path, start, start + len(NEEDLE.strip()), 0.6)
    answer = Answer("q", "a", token_ids=[], prompt_tokens=0, time_to_first_token_s=0.0, decode_tokens_per_s=0.0,
                    prefix_hit=True, stop_reason=StopReason.END, mean_logprob=0.0, passages=[span])
    line = attended_spans_text(answer, document)
    assert line.startswith(f"app.py, line {NEEDLE_ON_DISK}, characters {start:,}–"), line
