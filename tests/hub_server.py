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
can cancel mid-file). `log` records (method, path, Range header) of every request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SEND_CHUNK = 64 * 1024


def blob_id(data: bytes) -> str:
    """git's blob id: SHA-1 of "blob <size>\\0" + content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Serve `repos` ("org/name" -> folder of files) until `close()`. `url` is the endpoint."""

    def __init__(self, repos: dict[str, Path], gated: set[str] | None = None) -> None:
        self.repos = {repo: {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
                      for repo, folder in repos.items()}
        self.gated = gated or set()
        self.damaged: dict[str, bytes] = {}
        self.cut_after: dict[str, int] = {}
        self.chunk_delay_s = 0.0
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
        for name, data in files.items():
            sibling = {"rfilename": name}
            if blobs:
                sibling.update(size=len(data), blobId=blob_id(data))
                if name.endswith(".safetensors"):
                    sibling["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
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
        data = files[name]
        lfs = name.endswith(".safetensors")
        etag = hashlib.sha256(data).hexdigest() if lfs else blob_id(data)
        served = self.damaged.get(name, data)
        start = 0
        range_header = request.headers.get("Range")
        if range_header and body:
            start = int(range_header.split("=")[1].split("-")[0])
        request.send_response(206 if start else 200)
        request.send_header("ETag", f'"{etag}"')
        request.send_header("X-Repo-Commit", COMMIT)
        request.send_header("Accept-Ranges", "bytes")
        request.send_header("Content-Length", str(len(data) - start))
        if start:
            request.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if lfs:
            request.send_header("X-Linked-Etag", f'"{etag}"')
            request.send_header("X-Linked-Size", str(len(data)))
        request.end_headers()
        if not body:
            return
        end = min(len(data), self.cut_after.get(name, len(data)))
        position = start
        while position < end:
            piece = served[position:min(end, position + SEND_CHUNK)]
            try:
                request.wfile.write(piece)
                request.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):  # the client cancelled
                return
            position += len(piece)
            if self.chunk_delay_s:
                threading.Event().wait(self.chunk_delay_s)
        if end < len(data):
            request.close_connection = True  # Content-Length promised more: the client sees a short body

    @staticmethod
    def _error(request: BaseHTTPRequestHandler, status: int, code: str) -> None:
        payload = json.dumps({"error": code}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)


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
