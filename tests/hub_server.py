"""A local imitation of the Hugging Face hub's file API, on 127.0.0.1, for download tests.

It answers what huggingface_hub asks (read from huggingface_hub 2.4's hf_api.py and file_download.py):

    GET  /api/models/{org}/{name}[/revision/{rev}][?blobs=true]
         {"id", "sha", "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}
         (size / blobId / lfs only with blobs=true, as the hub does)
    HEAD /{org}/{name}/resolve/{rev}/{file}
         ETag (git blob id, or the LFS sha256 for weights), X-Repo-Commit, Content-Length, and for LFS
         files X-Linked-Etag / X-Linked-Size (what get_hf_file_metadata reads)
    GET  same path, with `Range: bytes=N-` answered 206 + Content-Range

Unknown repositories get 404 with `X-Error-Code: RepoNotFound`, gated ones 403 `GatedRepo`, as
hf_raise_for_status expects. Knobs for failures: `damaged` (file -> bytes served instead of the
real content, same length), `cut_after` (file -> bytes sent before the connection is closed while
Content-Length promises the whole file), `chunk_delay_s` (pause between 64 KiB chunks, so a test
can cancel mid-file), `info_without` ("hashes": the model info gives sizes but no blob ids or LFS
hashes; "sizes": neither, as some mirrors answer), `web_page` (file -> an HTML page served with
200 OK and text/html in its place, as a captive portal does; `web_page_type` overrides the type).
`log` records (method, path, Range header) of every request.

Files are read from disk as they are sent (their hashes once, when the hub starts), so real
weights can be served. Run as a program, it is a demo hub for trying Settings › Model without the
internet (`serve_demo`): it serves the embedded default model, converted to a model folder the way
Halaman's loader converts it, as its real hub id HuggingFaceTB/SmolLM2-135M-Instruct, and the tiny
random model as tiny/llama:

    .venv/bin/python tests/hub_server.py [--port 8765] [--slow [MIB_PER_S]]
    HF_ENDPOINT=http://127.0.0.1:8765 .venv/bin/halaman
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SEND_CHUNK = 64 * 1024
REPO_ROOT = Path(__file__).resolve().parent.parent


class _File:
    """A served file: where it is on disk, its size and hashes, computed once: SHA-256 (the LFS hash
    of weights) and git's blob id (SHA-1 of "blob <size>\\0" + content)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % self.size)
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha256.update(block)
                sha1.update(block)
        self.sha256, self.blob_id = sha256.hexdigest(), sha1.hexdigest()


class FakeHub:
    """Serve `repos` until `close()`; `url` is the endpoint. A repository is "org/name" -> a folder
    (every file directly in it) or a {file name: path} mapping. `port` 0 picks a free one."""

    def __init__(self, repos: dict[str, Path | dict[str, Path]], gated: set[str] | None = None, *,
                 port: int = 0) -> None:
        self.repos = {repo: {name: _File(path) for name, path in _files(source).items()} for repo, source in repos.items()}
        self.gated = gated or set()
        self.damaged: dict[str, bytes] = {}
        self.cut_after: dict[str, int] = {}
        self.chunk_delay_s = 0.0
        self.info_without: str | None = None
        self.web_page: dict[str, bytes] = {}
        self.web_page_type = "text/html; charset=utf-8"
        self.log: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------ routing
    def _answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlsplit(request.path)
        path = unquote(url.path)
        self.log.append((request.command, path, request.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
            return self._model_info("/".join(parts[2:4]), parse_qs(url.query).get("blobs") == ["true"], request, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file("/".join(parts[:2]), "/".join(parts[4:]), request, body)
        self._error(request, 404, "EntryNotFound")

    def _repo(self, repo: str, request: BaseHTTPRequestHandler) -> dict[str, bytes] | None:
        if repo in self.gated:
            self._error(request, 403, "GatedRepo")
            return None
        if repo not in self.repos:
            self._error(request, 404, "RepoNotFound")
            return None
        return self.repos[repo]

    def _model_info(self, repo: str, blobs: bool, request: BaseHTTPRequestHandler, body: bool) -> None:
        files = self._repo(repo, request)
        if files is None:
            return
        siblings = []
        for name, file in files.items():
            sibling = {"rfilename": name}
            if blobs and self.info_without != "sizes":
                sibling.update(size=file.size)
            if blobs and self.info_without is None:
                sibling.update(blobId=file.blob_id)
                if name.endswith(".safetensors"):
                    sibling["lfs"] = {"sha256": file.sha256, "size": file.size, "pointerSize": 134}
            siblings.append(sibling)
        payload = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings}).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if body:
            request.wfile.write(payload)

    def _file(self, repo: str, name: str, request: BaseHTTPRequestHandler, body: bool) -> None:
        files = self._repo(repo, request)
        if files is None:
            return
        if name not in files:
            return self._error(request, 404, "EntryNotFound")
        if name in self.web_page:
            return self._page(request, self.web_page[name], body)
        file = files[name]
        size = file.size
        lfs = name.endswith(".safetensors")
        etag = file.sha256 if lfs else file.blob_id
        start = 0
        range_header = request.headers.get("Range")
        if range_header and body:
            start = int(range_header.split("=")[1].split("-")[0])
        request.send_response(206 if start else 200)
        request.send_header("ETag", f'"{etag}"')
        request.send_header("X-Repo-Commit", COMMIT)
        request.send_header("Accept-Ranges", "bytes")
        request.send_header("Content-Length", str(size - start))
        if start:
            request.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        if lfs:
            request.send_header("X-Linked-Etag", f'"{etag}"')
            request.send_header("X-Linked-Size", str(size))
        request.end_headers()
        if not body:
            return
        end = min(size, self.cut_after.get(name, size))
        damaged = self.damaged.get(name)
        with file.path.open("rb") as handle:
            handle.seek(start)
            position = start
            while position < end:
                piece = handle.read(min(SEND_CHUNK, end - position))
                if damaged is not None:
                    piece = damaged[position:position + len(piece)]
                try:
                    request.wfile.write(piece)
                    request.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client cancelled
                    return
                position += len(piece)
                if self.chunk_delay_s:
                    threading.Event().wait(self.chunk_delay_s)
        if end < size:
            request.close_connection = True  # Content-Length promised more: the client sees a short body

    def _page(self, request: BaseHTTPRequestHandler, page: bytes, body: bool) -> None:
        request.send_response(200)
        request.send_header("Content-Type", self.web_page_type)
        request.send_header("Content-Length", str(len(page)))
        request.end_headers()
        if body:
            request.wfile.write(page)

    @staticmethod
    def _error(request: BaseHTTPRequestHandler, status: int, code: str) -> None:
        payload = json.dumps({"error": code}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)


def _files(source: Path | dict[str, Path]) -> dict[str, Path]:
    if isinstance(source, dict):
        return dict(sorted(source.items()))
    return {p.name: p for p in sorted(source.iterdir()) if p.is_file()}


def save_tiny_llama(folder: Path, tokenizer_folder: Path) -> Path:
    """A random-initialised Llama small enough to serve in tests (2 layers, hidden 64, head dim 32: the
    default KV group size must divide it), ~12 MiB of float32 weights, mostly the 49,152-token
    embedding, with the tokenizer files of `tokenizer_folder`."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, folder / name)
    return folder


TINY_REPO = "tiny/llama"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """`save_tiny_llama` with the embedded model's tokenizer, once per test module."""
    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), converted_folder(default_gguf_path()))


@pytest.fixture
def hub(tiny_llama, tmp_path, monkeypatch) -> Iterator[FakeHub]:
    """A FakeHub serving `tiny_llama` as TINY_REPO (and a gated copy as "gated/model"), with
    HF_ENDPOINT pointing at it and Halaman's home and the hub cache under tmp_path."""
    import huggingface_hub.constants

    server = FakeHub({TINY_REPO: tiny_llama, "gated/model": tiny_llama}, gated={"gated/model"})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # conftest turns the hub client's offline mode on so no test reaches the network; this server
    # is on 127.0.0.1, so requests to it are allowed (the flag is read once, at import).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield server
    server.close()


# ------------------------------------------------------------------ the demo hub (run as a program)
DEMO_PORT = 8765
SMOLLM2_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"  # catalog id smollm2-135m
SLOW_MIB_PER_S = 4.0  # --slow without a number: ~2 minutes for SmolLM2's 513 MiB


def smollm2_files() -> dict[str, Path]:
    """The embedded default model as a hub repository's files: its GGUF converted by the loader's own
    conversion (`engine.models.gguf_convert.converted_folder`; the folder Halaman already made if it
    has started once with the same HALAMAN_HOME), without the conversion's marker file. Its weights
    are the dequantized Q4_1 weights in float32: 513 MiB, where the real repository holds 257 MiB of
    bfloat16, so the download is bigger than the list's estimate."""
    from engine.models import gguf_convert
    from engine.models.source import default_gguf_path

    folder = gguf_convert.converted_folder(default_gguf_path())
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and p.name != gguf_convert._DONE_MARKER}


def serve_demo(port: int = DEMO_PORT, *, workdir: Path, chunk_delay_s: float = 0.0) -> FakeHub:
    """Start the demo hub on 127.0.0.1:`port` (0: a free one) serving SMOLLM2_REPO (real weights,
    `smollm2_files`) and TINY_REPO (`save_tiny_llama`, written into `workdir`). `chunk_delay_s`
    pauses between 64 KiB chunks. What `python tests/hub_server.py` runs; `close()` stops it."""
    smollm2 = smollm2_files()
    tiny = save_tiny_llama(workdir / "tiny-llama", smollm2["tokenizer.json"].parent)
    hub = FakeHub({SMOLLM2_REPO: smollm2, TINY_REPO: tiny}, port=port)
    hub.chunk_delay_s = chunk_delay_s
    return hub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A local imitation of the Hugging Face hub for trying Halaman's model downloads without the "
                    f"internet: serves the embedded SmolLM2-135M-Instruct (converted) as {SMOLLM2_REPO} and a tiny "
                    f"random model as {TINY_REPO} until Ctrl-C.")
    parser.add_argument("--port", type=int, default=DEMO_PORT, help=f"port on 127.0.0.1 (default {DEMO_PORT})")
    parser.add_argument("--slow", nargs="?", type=float, const=SLOW_MIB_PER_S, metavar="MIB_PER_S",
                        help=f"send about this many MiB/s (default {SLOW_MIB_PER_S:g} when no number is given), "
                             "to watch the progress and try Cancel and Resume")
    args = parser.parse_args(argv)
    delay = SEND_CHUNK / (args.slow * 1024 * 1024) if args.slow else 0.0
    try:  # fail before the slow preparation when the port is taken (bound as the server will bind it)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", args.port))
    except OSError as exc:
        print(f"cannot listen on 127.0.0.1:{args.port} ({exc.strerror}); pick another with --port", file=sys.stderr)
        return 1
    print("Preparing the models (the first time, this converts the embedded GGUF: 20 s to 2.5 minutes)...", flush=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar for the tiny model
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` also removes the tiny model's folder
    with tempfile.TemporaryDirectory(prefix="halaman-demo-hub-") as workdir:
        hub = serve_demo(args.port, workdir=Path(workdir), chunk_delay_s=delay)
        print(f"\nDemo hub on {hub.url}, serving{' slowly (about %g MiB/s)' % args.slow if args.slow else ''}:")
        for repo, files in hub.repos.items():
            size = sum(f.size for f in files.values())
            print(f"  {repo:38} {len(files)} files, {size / 1024**2:,.0f} MiB")
        print(f"\nIn another terminal, from the checkout, start Halaman against it:\n\n"
              f"  HF_ENDPOINT={hub.url} .venv/bin/halaman\n\n"
              "then File › Settings: select SmolLM2 135M Instruct in the model list, Download, then Save. Or from the terminal:\n\n"
              f"  HF_ENDPOINT={hub.url} .venv/bin/halaman models pull smollm2-135m --use\n\n"
              "Ctrl-C stops the hub.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("\nstopped")
        finally:
            hub.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))  # `engine` from this checkout
    sys.exit(main())
