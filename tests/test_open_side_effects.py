"""What opening a document makes Halaman do (docs/SECURITY.md): no URL in it is ever fetched, and
the only programs started are git (with the folder's commands off) and the PDF worker.

The documents point every kind of link at a real HTTP server on 127.0.0.1 that counts what it is
asked; Python's audit hooks (PEP 578) record every process this process starts and every socket
it opens while a document is loaded. The PDF worker is a child process the hook cannot see, so
for PDFs the server's count is the proof.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pdf_fixtures import truetype_pdf
from pypdf import PdfWriter
from pypdf.annotations import Link
from pypdf.generic import DictionaryObject, NameObject, TextStringObject

from engine.documents import load_document
from engine.documents.git import SAFE_CONFIG

_recording: list[tuple[str, tuple]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _recording is not None and event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec",
                                            "socket.connect", "socket.getaddrinfo", "urllib.Request"):
        _recording.append((event, args))


sys.addaudithook(_audit)  # hooks cannot be removed; this one records only inside `recorded()`


class _Counting(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self.server.hits.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    httpd.hits = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url(server: ThreadingHTTPServer, what: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{what}"


def recorded(path: Path) -> list[tuple[str, tuple]]:
    global _recording
    _recording = []
    try:
        load_document(path)
        return _recording
    finally:
        _recording = None


def started(events: list[tuple[str, tuple]]) -> list[list[str]]:
    return [[str(a) for a in args[1]] for event, args in events if event == "subprocess.Popen"]


def assert_no_network(events, server) -> None:
    assert [e for e in events if e[0] in ("socket.connect", "socket.getaddrinfo", "urllib.Request")] == []
    assert server.hits == []


def test_links_in_a_folder_are_never_fetched_and_only_safe_git_runs(tmp_path, server):
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text(
        f"# Links\n\n![logo]({url(server, 'logo.png')})\n[docs]({url(server, 'docs')})\n"
        f"<img src=\"{url(server, 'pixel.gif')}\">\n")
    (root / "page.html").write_text(
        f"<html><head><link rel=stylesheet href=\"{url(server, 'style.css')}\">"
        f"<script src=\"{url(server, 'app.js')}\"></script></head>"
        f"<body><p>The backup runs at 02:00.</p><img src=\"{url(server, 'img.png')}\"></body></html>\n")
    (root / "fetch.py").write_text(f"import requests\nrequests.get({url(server, 'api')!r})\n")
    if shutil.which("git") is not None:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        (root / ".gitmodules").write_text(f"[submodule \"lib\"]\n\tpath = lib\n\turl = {url(server, 'lib.git')}\n")
        for key, value in (("remote.origin.url", url(server, "repo.git")), ("remote.origin.promisor", "true"),
                           ("remote.origin.partialclonefilter", "blob:none"), ("core.repositoryformatversion", "1"),
                           ("extensions.partialClone", "origin")):
            subprocess.run(["git", "-C", str(root), "config", key, value], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    events = recorded(root)
    assert_no_network(events, server)
    assert len(started(events)) == (4 if shutil.which("git") else 0)  # rev-parse, ls-files twice, check-attr
    for command in started(events):
        assert Path(command[0]).name == "git", command
        assert command[1:1 + 2 * len(SAFE_CONFIG)] == [item for s in SAFE_CONFIG for item in ("-c", s)]
        assert command[command.index("-C") + 2] in ("rev-parse", "ls-files", "check-attr"), command


def test_links_and_actions_in_a_pdf_are_never_fetched(tmp_path, server):
    plain = truetype_pdf(tmp_path / "plain.pdf", ["The backup runs at 02:00.", f"See {url(server, 'text')}"])
    writer = PdfWriter(clone_from=plain)
    writer.add_annotation(0, Link(rect=(72, 700, 300, 720), url=url(server, "annotation")))
    def action(kind: str, **fields: str) -> DictionaryObject:
        return DictionaryObject({NameObject("/S"): NameObject(kind),
                                 **{NameObject(f"/{k}"): TextStringObject(v) for k, v in fields.items()}})

    writer._root_object[NameObject("/OpenAction")] = action("/JavaScript", JS=f"app.launchURL('{url(server, 'js')}', true);")
    writer.pages[0][NameObject("/AA")] = DictionaryObject({NameObject("/O"): action("/URI", URI=url(server, "page-open"))})
    path = tmp_path / "links.pdf"
    writer.write(path)
    events = recorded(path)
    assert_no_network(events, server)
    assert [Path(c[0]).name == Path(sys.executable).name and c[1:3] == ["-m", "engine.documents.pdf_worker"]
            for c in started(events)] == [True]
    assert "02:00" in load_document(path).render()


def test_links_in_a_text_file_are_never_fetched(tmp_path, server):
    path = tmp_path / "notes.md"
    path.write_text(f"Read {url(server, 'a')} and ![x]({url(server, 'b.png')}).\n")
    events = recorded(path)
    assert_no_network(events, server)
    assert started(events) == []


def test_a_module_in_the_current_folder_does_not_run_in_the_pdf_worker(tmp_path, monkeypatch):
    """Halaman started from inside a downloaded folder (`halaman ask report.pdf` there, or a file
    manager that starts it in the file's folder): `python -m` would put that folder first on the
    worker's sys.path, and its `json.py` would run in place of the standard library's."""
    folder = tmp_path / "downloaded"
    folder.mkdir()
    marker = tmp_path / "RAN.txt"
    (folder / "json.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    pdf = truetype_pdf(folder / "report.pdf", ["The backup runs at 02:00."])
    monkeypatch.chdir(folder)
    assert "02:00" in load_document(pdf).render()
    assert not marker.exists()
