"""Each input of issue 33 (B20–B30 in shared/corpus/bugs/) through the real window, without a model.

A document is opened as a user opens it (the read fails where the model loads: its name is shown
while it is read and in the error), then what its reader returns is shown as an open shows it: its
library row and tooltip, the header, its warnings in the banner and every page or file in the
source pane. Answers are streamed through the real worker as if the model had written them.

Run only by tests/test_window_inputs.py, each case in a process of its own under a memory limit and
a timeout, so that a crash or a freeze fails the case instead of ending the test run; the file is
not named test_*.py so that pytest does not collect it with the rest.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from app.open_flow import warning_note  # noqa: E402
from engine.documents import Document, load_document  # noqa: E402
from engine.errors import HalamanError  # noqa: E402
from engine.library import Library  # noqa: E402
from engine.settings import settings_path  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import add_document, hover, notes_and_other, pick, stream_answer, window_without_model  # noqa: E402

SHOWN_WITHIN_S = 1.0
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def bug(corpus: Path, case: str) -> Path:
    return next((corpus / "bugs").glob(f"{case}-*"))


def build(script: Path, out: Path) -> Path:
    """Run a case's builder into `out`."""
    out.mkdir(exist_ok=True)
    runner = [sys.executable] if script.suffix == ".py" else ["sh"]
    subprocess.run([*runner, str(script), str(out)], check=True, timeout=120, env={**os.environ, **GIT_IDENTITY})
    return out


def show(qtbot, window, path: Path) -> Document | None:
    """Open `path` in `window` as a user does, then show what its reader returns (see the module
    docstring); None when the reader refuses it (its message is then the banner's)."""
    name = path.resolve().name
    window.open_path(str(path))
    window.grab()
    qtbot.waitUntil(lambda: window.banner.kind == "error" and window.banner.isVisible(), timeout=30_000)
    assert window.banner.text.startswith(f"Could not open {name}: ")
    try:
        document = load_document(path)
    except HalamanError as error:
        window.banner.show_message("error", f"Could not open {name}: {error}")
        window.grab()
        return None
    document_id = add_document(window, path, document)
    pick(window, document_id)
    window.grab()
    assert window.header.title.text() == document.title
    hover(window, document_id)
    if document.warnings:
        window.banner.show_message("warning", warning_note(document.warnings))
    window.open_source_pane()
    for index in range(len(document.segments)):
        window.source_pane.show_segment(document, index, [])
        window.grab()
    return document


def test_b20(qtbot, home, corpus):
    window = window_without_model(qtbot)
    folder = bug(corpus, "B20")
    assert show(qtbot, window, folder / "title-img.pdf").title == '<img src="/dev/zero">'
    assert window.header.title.text() == '<img src="/dev/zero">'
    assert show(qtbot, window, folder / "title-plain.pdf").title == "Quarterly report 2024"


def test_b21(qtbot, home, corpus, tmp_path):
    out = build(bug(corpus, "B21") / "build.sh", tmp_path / "b21")
    to_dev_zero, to_pipe, saved = (out / "answers.txt").read_text(encoding="utf-8").splitlines()
    window, document_id, other_id = notes_and_other(qtbot, tmp_path)
    for answer, shown in ((to_dev_zero, "Here is the chart: [image not shown: chart]"), (to_pipe, "Here: [image not shown: x]")):
        assert stream_answer(qtbot, window, document_id, "Show the chart", answer) < SHOWN_WITHIN_S, answer
        window.grab()
        assert shown in window.chat.toPlainText()

    window.library.add_message(other_id, "user", "How did revenue change?")
    window.library.add_message(other_id, "assistant", saved, source="local")
    began = time.monotonic()
    pick(window, other_id)
    window.grab()
    assert time.monotonic() - began < SHOWN_WITHIN_S
    assert "Revenue rose 12 %. [image not shown: chart]" in window.chat.toPlainText()
    window.close()

    again = window_without_model(qtbot, library=Library())
    began = time.monotonic()
    pick(again, other_id)
    again.grab()
    assert time.monotonic() - began < SHOWN_WITHIN_S
    assert "Revenue rose 12 %. [image not shown: chart]" in again.chat.toPlainText()
    pick(again, document_id)
    again.grab()
    assert "Here: [image not shown: x]" in again.chat.toPlainText()


def test_b22(qtbot, home, corpus):
    document = show(qtbot, window_without_model(qtbot), bug(corpus, "B22") / "note-with-image.md")
    assert "The centrifuge setting was 4,000 rpm." in document.render()


def test_b23(qtbot, home, corpus, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    out = build(bug(corpus, "B23") / "build.sh", tmp_path / "b23")
    window = window_without_model(qtbot)
    assert [s.path for s in show(qtbot, window, out / "home" / "projects" / "notes").segments] == ["minutes.txt", "tool.py"]
    assert [s.path for s in show(qtbot, window, out / "proj" / "build-out" / "docs").segments] == ["index.md"]


def test_b24(qtbot, home, corpus):
    document = show(qtbot, window_without_model(qtbot), bug(corpus, "B24") / "ocg-hidden.pdf")
    assert "HIDDEN LAYER" not in document.render()


def test_b25(qtbot, home, corpus):
    document = show(qtbot, window_without_model(qtbot), bug(corpus, "B25") / "tag-smuggling.md")
    assert "The contract runs until 2027" in document.render()


def test_b26(qtbot, home, corpus, tmp_path):
    out = build(bug(corpus, "B26") / "build.py", tmp_path / "b26")
    try:
        document = show(qtbot, window_without_model(qtbot), out / "repo")
        assert [s.path for s in document.segments] == ["top.txt"]
    finally:
        subprocess.run(["rm", "-rf", str(out)], check=True, timeout=120)  # shutil.rmtree recurses per folder


def test_b27(qtbot, home, corpus):
    window = window_without_model(qtbot)
    for name, shown in (("freetext-no-ap.pdf", "Approved budget: 4200 EUR"), ("form-no-ap.pdf", "Jane Q. Example"),
                        ("freetext-with-ap.pdf", "Approved budget: 4200 EUR")):
        assert shown in show(qtbot, window, bug(corpus, "B27") / name).render()


def test_b28(qtbot, home, corpus):
    document = show(qtbot, window_without_model(qtbot), bug(corpus, "B28") / "hyphen.pdf")
    assert "document" in document.render()


@pytest.mark.parametrize("name", ["settings-bom.toml", "settings-unknown-key.toml"])
def test_b29(qtbot, home, corpus, name):
    settings = settings_path()
    shutil.copyfile(bug(corpus, "B29") / name, settings)
    window = window_without_model(qtbot)
    window.grab()
    if name == "settings-bom.toml":
        assert not window.banner.isVisible()
    else:
        assert window.banner.text == f"settings file {settings}: unknown setting theme ignored"


def test_b30(qtbot, home, corpus, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    out = build(bug(corpus, "B30") / "build.sh", tmp_path / "b30")
    window = window_without_model(qtbot)
    assert "main.py" in [s.path for s in show(qtbot, window, out / "repo").segments]
    assert show(qtbot, window, out / "repo" / "data" / "report.pdf") is None
    assert "is a Git LFS pointer, not the file" in window.banner.text
