"""B02 (docs/REAL_WORLD_INPUTS.md): file and folder names that are not UTF-8 (Latin-1 bytes from an
old zip), made in the test's temporary folder, as a plain folder and as a git work tree; and the
valid-Unicode boundary."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.documents import Document, DocumentError, Segment, load_document
from engine.documents.names import display_name
from engine.errors import HalamanError
from engine.prefix_store import PrefixStore
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings

SMALL = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64, chunk_tokens=256),
                       max_new_tokens=8)


def latin1(parent: Path, name: bytes) -> Path:
    """The path of `parent`/`name`, where `name` is raw bytes (Python's surrogateescape str)."""
    return Path(os.fsdecode(os.fsencode(parent) + b"/" + name))


def menu_folder(parent: Path, folder: bytes = b"plain", git: bool = False) -> Path:
    root = latin1(parent, folder)
    root.mkdir()
    latin1(root, b"caf\xe9-menu.txt").write_text("Soup of the day: lentils with lemon.\n")
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root


def assert_valid_unicode(document: Document) -> None:
    document.render().encode("utf-8")
    document.title.encode("utf-8")
    for warning in document.warnings:
        warning.encode("utf-8")


@pytest.mark.parametrize("git", [False, True], ids=["folder", "git"])
def test_b02_latin1_file_name_is_decoded_in_labels(tmp_path, git):
    if git and shutil.which("git") is None:
        pytest.skip("git not installed")
    root = menu_folder(tmp_path, git=git)
    document = load_document(root)
    assert [s.label for s in document.segments] == ["café-menu.txt"]
    assert [s.path for s in document.segments] == ["café-menu.txt"]
    assert document.segments[0].text == "Soup of the day: lentils with lemon."
    assert_valid_unicode(document)


def test_b02_latin1_folder_name_is_decoded_in_the_title(tmp_path):
    document = load_document(menu_folder(tmp_path, b"men\xfc-repo", git=shutil.which("git") is not None))
    assert document.title == "menü-repo"
    assert_valid_unicode(document)


def test_b02_latin1_names_of_single_files(tmp_path):
    text_file = latin1(tmp_path, b"r\xe9sum\xe9.txt")
    text_file.write_bytes(b"Ten years of soup.\n")
    assert load_document(text_file).title == "résumé.txt"
    empty = latin1(tmp_path, b"vide-\xe9t\xe9.txt")
    empty.write_bytes(b"")
    with pytest.raises(DocumentError) as info:
        load_document(empty)
    assert str(info.value).startswith("vide-été.txt is empty")


def test_display_name_keeps_valid_names_and_never_raises():
    assert display_name("naïve – ok.md") == "naïve – ok.md"
    assert display_name(os.fsdecode(b"caf\xc3\xa9\xff")) == "cafÃ©ÿ"  # not UTF-8 as a whole: cp1252
    assert display_name("\ud800") == "\ufffd"  # a surrogate that never came from a file name


def test_b02_prefix_store_put_never_raises_for_a_surrogate_label(tmp_path):
    import torch

    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    entry = store.put("a" * 64, {"x": torch.zeros(2)}, {}, n_tokens=1, label=os.fsdecode(b"caf\xe9 \xb7 model"))
    assert entry.label == "caf\ufffd \ufffd model" and store.entries()[0].label == entry.label


def test_b02_latin1_repository_opens_is_cached_and_answered(smol, tmp_path):
    root = menu_folder(tmp_path, b"men\xfc-repo", git=shutil.which("git") is not None)
    store = PrefixStore(tmp_path / "prefix", disk_budget_bytes=256 * 1024**2)
    first = DocumentSession(smol, SMALL, store).open(str(root))
    assert not first.prefix_hit and first.title == "menü-repo"
    assert [e.label for e in store.entries()] == [f"menü-repo · {smol.label}"]
    session = DocumentSession(smol, SMALL, store)
    assert session.open(str(root)).prefix_hit
    assert session.ask("What is the soup of the day?").token_ids


def test_invalid_unicode_is_refused_before_any_model_work(smol):
    """A loader bug that let a surrogate through: a DocumentError naming the file, not a TypeError
    from the tokenizer (and no prefill: the session has no document afterwards)."""
    bad = Document(title="menu.txt", source="/tmp/menu.txt", kind="text",
                   segments=[Segment(text="caf\udce9", label="menu.txt", page=None, path=None)])
    session = DocumentSession(smol, SMALL, None)
    with pytest.raises(DocumentError, match=r"^menu.txt: the text contains an invalid character \(U\+DCE9"):
        session.open(bad)
    assert session.document is None


def test_nothing_but_halaman_errors_leave_open(smol, tmp_path):
    """A non-Halaman exception inside open (here: a path of the wrong type) arrives as one line."""
    session = DocumentSession(smol, SMALL, None)
    with pytest.raises(HalamanError, match=r"^opening the document failed with an internal error \(TypeError"):
        session.open(12345)
