"""A real OpenAI-compatible Chat Completions server for the cloud tests, on 127.0.0.1 (port 0).

It speaks HTTP/1.1 over real sockets from its own thread. The request's `model` picks the
behaviour (see SCENARIOS); every request is recorded (path, headers, JSON body), and the server
notes when a client closes a connection it is still streaming to (`closed`).

    with CloudServer() as server:
        settings = cloud_settings(server.base_url, "ok")
"""

from __future__ import annotations

import gzip
import json
import select
import socket
import ssl
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


PIECES = ["The answer ", "is ", "forty-", "two."]
USAGE = {"prompt_tokens": 321, "completion_tokens": 7, "total_tokens": 328}
CONTEXT_MESSAGE = ("This model's maximum context length is 8192 tokens. However, your messages resulted in "
                   "20000 tokens. Please reduce the length of the messages.")


class CloudServer:
    """The server, its recorded requests and what it observed. Use as a context manager."""

    def __init__(self, *, expected_key: str | None = None, tls: ssl.SSLContext | None = None,
                 replay: dict[str, bytes | tuple[bytes, float]] | None = None,
                 canned: dict[str, tuple[int, bytes]] | None = None) -> None:
        self.expected_key = expected_key
        # model name -> a recorded event-stream body, served by the "replay" scenario (keep-alive
        # comments paced 0.5 s apart; the connection stays open after a body without [DONE]), or
        # (body, seconds between its events) as a recording's response.json gives them
        self.replay = {model: body if isinstance(body, tuple) else (body, 0.0) for model, body in (replay or {}).items()}
        # model name -> (status, JSON body): an error response exactly as some server words it
        self.canned = dict(canned or {})
        self.first_request_at: dict[str, float] = {}
        self.requests: list[dict] = []
        self.counts: Counter[str] = Counter()
        self.accepted = 0                  # TCP connections accepted
        self.closed = threading.Event()    # a client went away while a response was in progress
        self.closed_at: float | None = None
        self.stop = threading.Event()
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.cloud = self
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        scheme = "https" if tls else "http"
        self.base_url = f"{scheme}://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def mark_closed(self) -> None:
        if not self.closed.is_set():
            self.closed_at = time.monotonic()
            self.closed.set()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> CloudServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    cloud: CloudServer

    def verify_request(self, request, client_address) -> bool:
        self.cloud.accepted += 1
        return True

    def handle_error(self, request, client_address) -> None:
        pass  # failed TLS handshakes and clients that hang up are part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    chunked = True
    server: _Server

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    # ---------------------------------------------------------------- routing
    def do_POST(self) -> None:
        cloud = self.server.cloud
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        cloud.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        model = body.get("model", "")
        cloud.counts[model] += 1
        cloud.first_request_at.setdefault(model, time.monotonic())
        if not self.path.split("?")[0].endswith("/v1/chat/completions"):
            return self.json_error(404, f"Invalid URL (POST {self.path})", "not_found")
        if cloud.expected_key is not None and self.headers.get("Authorization") != f"Bearer {cloud.expected_key}":
            return self.json_error(401, "Incorrect API key provided: " + (self.headers.get("Authorization") or "none"), "invalid_api_key")
        if model in cloud.canned:
            status, data = cloud.canned[model]
            return self.send_body(status, "application/json", data)
        scenario = _replay if model in cloud.replay else SCENARIOS.get(model, _ok)
        scenario(self, body, cloud.counts[model])

    # ---------------------------------------------------------------- writing
    def send_body(self, status: int, content_type: str, data: bytes, headers: dict | None = None) -> None:
        """A whole (non-streamed) response with its Content-Length."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def json_error(self, status: int, message: str, code: str, headers: dict | None = None) -> None:
        data = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()
        self.send_body(status, "application/json", data, headers)

    def start_stream(self, *, chunked: bool = True) -> None:
        self.chunked = chunked
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:  # HTTP/1.0 style: the body ends when the connection closes
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def write(self, data: bytes) -> bool:
        """Send bytes (one HTTP chunk); False if the client has gone."""
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
            self.wfile.flush()
            return True
        except OSError:
            self.server.cloud.mark_closed()
            return False

    def event(self, payload: dict | str) -> bool:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return self.write(f"data: {text}\n\n".encode())

    def piece(self, text: str, finish: str | None = None, model: str = "served-model") -> bool:
        return self.event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})

    def finish(self, reason: str = "stop", usage: bool = True, done: bool = True) -> None:
        self.event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "served-model",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
        if usage:
            self.event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "served-model",
                        "choices": [], "usage": USAGE})
        if done:
            self.event("[DONE]")
        if self.chunked:
            self.wfile.write(b"0\r\n\r\n")

    def abort(self) -> None:
        """Close the connection now, mid-body (no terminating chunk)."""
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def wait_watching(self, seconds: float) -> bool:
        """Sleep up to `seconds`, returning True as soon as the client closes the connection."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.server.cloud.stop.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.02)
            if readable:
                try:
                    data = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    self.server.cloud.mark_closed()
                    return True
                time.sleep(0.02)
        return False


# ------------------------------------------------------------------ scenarios
def _ok(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.write(b": keep-alive comment\n\n")
    for text in PIECES:
        h.piece(text)
    h.finish(usage=bool(body.get("stream_options", {}).get("include_usage")))


def _crlf(h: _Handler, body: dict, n: int) -> None:
    """CRLF line ends, one event split over two writes, multi-line data."""
    h.start_stream()
    for text in PIECES:
        line = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
        h.write(f"data: {line[:10]}".encode())
        h.write(f"{line[10:]}\r\n\r\n".encode())
    h.write(b'data: {"choices": [{"index": 0, "delta": {},\r\ndata: "finish_reason": "stop"}]}\r\n\r\n')
    h.write(b"data: [DONE]\r\n\r\n")
    h.wfile.write(b"0\r\n\r\n")


def _json(h: _Handler, body: dict, n: int) -> None:
    data = json.dumps({"id": "chatcmpl-2", "object": "chat.completion", "model": "served-model",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(PIECES)},
                                    "finish_reason": "stop"}], "usage": USAGE}).encode()
    h.send_body(200, "application/json", data)


def _strict(h: _Handler, body: dict, n: int) -> None:
    if "stream_options" in body:
        return h.json_error(400, "Unrecognized request argument supplied: stream_options", "invalid_request")
    _ok(h, body, n)


def _length(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.piece("Truncated by max_tokens")
    h.finish("length")


def _slow(h: _Handler, body: dict, n: int) -> None:
    """A piece, then one more every 5 s: a cancel must not wait for the next one."""
    h.start_stream()
    for text in PIECES:
        if not h.piece(text) or h.wait_watching(5.0):
            return
    h.finish()


def _hang(h: _Handler, body: dict, n: int) -> None:
    """No response headers for 5 s (a busy endpoint)."""
    if h.wait_watching(5.0):
        return
    _ok(h, body, n)


def _stall(h: _Handler, body: dict, n: int) -> None:
    """Two pieces, then silence: the client's read timeout must fire."""
    h.start_stream()
    h.piece(PIECES[0])
    h.piece(PIECES[1])
    h.wait_watching(5.0)


def _cut(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.piece(PIECES[0])
    h.piece(PIECES[1])
    h.abort()


def _cut_eof(h: _Handler, body: dict, n: int) -> None:
    h.start_stream(chunked=False)
    h.piece(PIECES[0])
    h.piece(PIECES[1])
    h.abort()


def _cut_early(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.abort()


def _malformed(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.piece(PIECES[0])
    h.write(b"data: {this is not json\n\n")
    h.finish()


def _error_event(h: _Handler, body: dict, n: int) -> None:
    h.start_stream()
    h.piece(PIECES[0])
    h.event({"error": {"message": "The server is overloaded", "type": "server_error"}})
    h.wfile.write(b"0\r\n\r\n")


def _html(h: _Handler, body: dict, n: int) -> None:
    h.send_body(200, "text/html", b"<html><body>Welcome to the hotel Wi-Fi</body></html>")


def _redirect(h: _Handler, body: dict, n: int) -> None:
    h.send_response(307)
    h.send_header("Location", "http://127.0.0.1:9/elsewhere/v1/chat/completions")
    h.send_header("Content-Length", "0")
    h.end_headers()


def _retry_429(h: _Handler, body: dict, n: int) -> None:
    if n == 1:
        return h.json_error(429, "Rate limit reached for requests", "rate_limit_exceeded", {"Retry-After": "1"})
    _ok(h, body, n)


def _retry_500(h: _Handler, body: dict, n: int) -> None:
    if n == 1:
        return h.json_error(500, "The server had an error while processing your request", "server_error")
    _ok(h, body, n)


def _always(status: int, message: str, code: str, headers: dict | None = None):
    return lambda h, body, n: h.json_error(status, message, code, headers)


SCENARIOS = {
    "ok": _ok, "crlf": _crlf, "json": _json, "strict": _strict, "length": _length,
    "slow": _slow, "hang": _hang, "stall": _stall,
    "cut": _cut, "cut-eof": _cut_eof, "cut-early": _cut_early,
    "malformed": _malformed, "error-event": _error_event, "html": _html, "redirect": _redirect,
    "retry-429": _retry_429, "retry-500": _retry_500,
    "down-503": _always(503, "Service temporarily unavailable", "overloaded"),
    "wait-an-hour": _always(429, "Quota exceeded", "rate_limit_exceeded", {"Retry-After": "3600"}),
    "missing-model": _always(404, "The model `missing-model` does not exist or you do not have access to it.", "model_not_found"),
    "forbidden": _always(403, "Project does not have access to this model", "forbidden"),
    "context-400": _always(400, CONTEXT_MESSAGE, "context_length_exceeded"),
    "bad-400": _always(400, "temperature must be at most 2", "invalid_value"),
}


KEEP_ALIVE_S = 0.5
HOLD_OPEN_S = 20.0


def _replay(h: _Handler, body: dict, n: int) -> None:
    """Serve a recorded body event by event; a body without [DONE] keeps the connection open,
    sending keep-alives, until the client leaves (or HOLD_OPEN_S)."""
    data, delay_s = h.server.cloud.replay[body["model"]]
    h.start_stream()
    for event in data.split(b"\n\n"):
        if not event.strip():
            continue
        if event.startswith(b":") and h.wait_watching(KEEP_ALIVE_S):
            return
        if not h.write(event + b"\n\n"):
            return
        if delay_s and not event.startswith(b":") and h.wait_watching(delay_s):
            return
    if b"data: [DONE]" in data:
        h.wfile.write(b"0\r\n\r\n")
        return
    deadline = time.monotonic() + HOLD_OPEN_S
    while time.monotonic() < deadline and h.write(b": keep-alive\n\n") and not h.wait_watching(KEEP_ALIVE_S):
        pass


def _retry_after_ms(header: str):
    """429 with only `header: 4000` (milliseconds) until 4 s after the first request, then the answer."""
    def scenario(h: _Handler, body: dict, n: int) -> None:
        if time.monotonic() - h.server.cloud.first_request_at[body["model"]] < 4.0:
            return h.json_error(429, "Rate limit reached. Please retry after 4000 ms.", "rate_limit", {header: "4000"})
        _ok(h, body, n)
    return scenario


def _compressed(encoding: str):
    """The normal answer as one event stream compressed with `encoding` ("gzip", or "br": bogus bytes)."""
    def scenario(h: _Handler, body: dict, n: int) -> None:
        events = [{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]} for text in PIECES]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        raw = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
        data = gzip.compress(raw) if encoding == "gzip" else b"\x1b\x2a\x00" + raw[:40]
        h.send_body(200, "text/event-stream", data, {"Content-Encoding": encoding})
    return scenario


SCENARIOS.update({
    "retry-after-ms": _retry_after_ms("retry-after-ms"),
    "x-ms-retry-after-ms": _retry_after_ms("x-ms-retry-after-ms"),
    "gzip": _compressed("gzip"), "brotli": _compressed("br"),
})


# ------------------------------------------------------------------ helpers for fixtures
def self_signed_context(tmp_path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context
