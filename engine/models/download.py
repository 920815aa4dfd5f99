"""Download a model from the Hugging Face hub into Halaman's cache: progress, cancel, resume, verify.

    folder = pull("Qwen/Qwen2.5-1.5B-Instruct", progress=print, cancel=threading.Event())

The file list, sizes and hashes come from the hub's model info (`HfApi.model_info(files_metadata=True)`:
GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true); each file is fetched from
{endpoint}/{repo}/resolve/{commit}/{file}, so every file comes from the same commit. `HF_ENDPOINT`
and `HF_TOKEN` / `hf auth login` are honoured, and requests go through huggingface_hub's HTTP
client (its proxy settings and headers).

huggingface_hub's own `snapshot_download` is not used for the transfer because it cannot resume a
file: since 2.x it writes each file to a uniquely named temporary file and deletes it when the
transfer stops (`file_download._download_to_tmp_and_move`). Here a file grows in `<name>.part`
beside its final name and a new attempt asks for the rest with an HTTP Range request, so Ctrl-C or
Cancel leaves a partial that the next pull continues.

A file is verified before it takes its final name: its size against the hub's, its SHA-256
against the hub's LFS hash (weights) or its git blob id (small files: SHA-1 of "blob <size>\\0" +
content), and its content against its format (`engine.models.verify`: a safetensors header whose
tensors fill the file, JSON that parses, never a web page). A mirror that gives no sizes or hashes
still gets the content check, with the size the server announces. A folder is complete when
`COMPLETE_MARKER` is written after the last file and the weights' shapes agree with config.json.

One pull of a model runs at a time across processes (a file lock beside its folder): a second
`halaman` pulling the same model waits, then finds every file in place.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from engine import paths
from engine.errors import Cancelled, ModelError
from engine.models.verify import WEB_PAGE, check_against_config, check_file, looks_like_web_page
from engine.units import format_bytes, format_duration

# The files a model needs (transformers 5 keeps the chat template in chat_template.jinja); top
# level only here (Llama repositories also carry an "original/" folder of checkpoint files).
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja")
COMPLETE_MARKER = ".halaman-complete.json"
PART_SUFFIX = ".part"
CHUNK_BYTES = 1 << 20
SPEED_WINDOW_S = 5.0      # speed is measured over the last few seconds: a stalled link shows at once
PROGRESS_EVERY_S = 0.2    # at most this often, plus once per finished file
TIMEOUT_S = 30.0          # connect and per-read timeout
LOCK_POLL_S = 0.5         # a pull waiting for another process's checks cancel this often


@dataclass(frozen=True)
class DownloadProgress:
    """Where a download stands. Bytes count all files of the model, resumed parts included."""

    repo: str
    file: str                   # the file being transferred
    done_bytes: int
    total_bytes: int
    speed_bytes_per_s: float    # over the last SPEED_WINDOW_S seconds; 0 before the first bytes
    eta_s: float | None         # None while the speed is unknown
    verifying: bool = False     # `file` has arrived and its SHA-256 is being checked (seconds for GiBs)

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 0.0

    def summary(self) -> str:
        """'1.2 GiB of 3.1 GiB (38 %, 45.2 MiB/s, 42 s left)'; speed and time left once known; while
        a file is checked, 'verifying model.safetensors (SHA-256)… 1.2 GiB of 3.1 GiB'."""
        if self.verifying:
            return f"verifying {self.file} (SHA-256)… {format_bytes(self.done_bytes)} of {format_bytes(self.total_bytes)}"
        speed = f", {format_bytes(self.speed_bytes_per_s)}/s" if self.speed_bytes_per_s else ""
        left = f", {format_duration(self.eta_s)} left" if self.eta_s is not None and self.done_bytes < self.total_bytes else ""
        return f"{format_bytes(self.done_bytes)} of {format_bytes(self.total_bytes)} ({self.fraction:.0%}{speed}{left})"


@dataclass(frozen=True)
class RemoteFile:
    """A file of a hub repository: its size in bytes (None when the hub's model info gives none, as
    some mirrors do) and what to verify it with."""

    name: str
    size: int | None
    sha256: str | None     # LFS files (weights)
    blob_id: str | None    # git blob SHA-1 (every file)


def models_dir() -> Path:
    """Where downloaded models live: <cache dir>/models/<org>--<name>/ (created on demand)."""
    path = paths.cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_folder(repo: str) -> Path:
    """The folder `repo` ("org/name") downloads into, whether or not it is there yet."""
    return models_dir() / repo.replace("/", "--")


def downloaded_folder(repo: str) -> Path | None:
    """The folder of a completely downloaded and verified `repo`, else None."""
    folder = model_folder(repo)
    return folder if (folder / COMPLETE_MARKER).is_file() else None


def partial_bytes(repo: str) -> int:
    """Bytes already on disk for an unfinished download of `repo` (0 when none or complete)."""
    folder = model_folder(repo)
    if not folder.is_dir() or downloaded_folder(repo):
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def pull(repo: str, *, revision: str = "main", progress: Callable[[DownloadProgress], None] | None = None,
         cancel: threading.Event | None = None, endpoint: str | None = None) -> Path:
    """Download `repo` ("org/name") at `revision` into `model_folder(repo)`, resuming what an earlier
    pull left, and return the folder once every file is verified.

    `progress` is called from this thread, at most every PROGRESS_EVERY_S seconds. `endpoint`
    defaults to $HF_ENDPOINT (read now, not at import) or https://huggingface.co.
    Raises Cancelled when `cancel` is set (the partial file stays for the next pull) and ModelError
    for everything the user must act on: offline, unknown or gated repository, a file that fails
    verification (it is deleted, so the next pull fetches it afresh), a connection that dropped.
    """
    from huggingface_hub import constants

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    cancel = cancel or threading.Event()
    commit, files = remote_files(repo, revision, endpoint)
    folder = model_folder(repo)
    folder.mkdir(parents=True, exist_ok=True)
    with _download_lock(folder, cancel):
        _forget_other_commit(folder, commit)
        meter = _Meter(repo, sum(f.size or 0 for f in files), progress)
        for remote in files:
            target = folder / remote.name
            if target.is_file() and remote.size in (None, target.stat().st_size):
                meter.found(remote.name, target.stat().st_size)  # verified when it was renamed into place
                continue
            _fetch(f"{endpoint}/{repo}/resolve/{commit}/{remote.name}", folder / (remote.name + PART_SUFFIX), remote,
                   meter, cancel)
            (folder / (remote.name + PART_SUFFIX)).replace(target)
        meter.finish()
        check_against_config(folder)
        paths.write_text_atomic(folder / COMPLETE_MARKER, json.dumps(
            {"repo": repo, "commit": commit, "files": {f.name: (folder / f.name).stat().st_size for f in files}}, indent=1))
    return folder


@contextlib.contextmanager
def _download_lock(folder: Path, cancel: threading.Event) -> Iterator[None]:
    """One pull of a model at a time across processes (`<folder>.lock`, filelock): two would append
    to the same `.part` file and rename it from under each other. A second pull waits, then finds
    the files already there; `cancel` stops the wait (Cancelled)."""
    lock = filelock.FileLock(folder.with_name(folder.name + ".lock"))
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            break
        except filelock.Timeout:
            if cancel.is_set():
                raise Cancelled(f"download of {folder.name} cancelled while another Halaman process was downloading it") from None
    try:
        yield
    finally:
        lock.release()


def remote_files(repo: str, revision: str, endpoint: str) -> tuple[str, list[RemoteFile]]:
    """The commit `revision` points at and the files a model needs there, with sizes and hashes.
    Raises ModelError with what to do when the hub cannot be asked or refuses."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=revision, files_metadata=True, timeout=TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line the user can act on
        raise _hub_error(repo, exc, endpoint) from None
    files = [
        RemoteFile(s.rfilename, int(s.size) if s.size is not None else None, s.lfs.sha256 if s.lfs else None, s.blob_id)
        for s in info.siblings or []
        if "/" not in s.rfilename and any(fnmatch.fnmatch(s.rfilename, p) for p in ALLOW_PATTERNS)
    ]
    if not any(f.name.endswith(".safetensors") for f in files):
        raise ModelError(f"{repo} has no .safetensors weights; Halaman loads safetensors models (or a .gguf file)")
    return info.sha or revision, sorted(files, key=lambda f: f.size or 0)  # small files first: a bad id fails fast


def _fetch(url: str, part: Path, remote: RemoteFile, meter: _Meter, cancel: threading.Event) -> None:
    """Append the rest of `remote` to `part` (Range from its current size), then verify it. Without a
    size from the hub, the size the server announces (Content-Length, Content-Range) is checked."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    have = part.stat().st_size if part.is_file() else 0
    if remote.size is not None and have > remote.size:  # not a prefix of this file: start again
        part.unlink()
        have = 0
    meter.found(remote.name, have)
    expected = remote.size
    if remote.size is None or have < remote.size:
        headers = build_hf_headers()
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with get_session().stream("GET", url, headers=headers, timeout=TIMEOUT_S) as response:
                if response.status_code == 416 and have:  # nothing after `have`: the part is whole
                    expected = expected if expected is not None else have
                else:
                    hf_raise_for_status(response)
                    expected = _receive(response, part, have, remote, meter, cancel)
        except (Cancelled, ModelError):
            raise
        except Exception as exc:  # noqa: BLE001 - the partial stays; the next pull resumes it
            raise ModelError(f"the download of {remote.name} stopped ({type(exc).__name__}); "
                             "check your connection and pull again to resume") from None
    meter.verifying(remote.name)
    _verify(part, remote, expected)


def _receive(response, part: Path, have: int, remote: RemoteFile, meter: _Meter, cancel: threading.Event) -> int | None:
    """Write `response`'s body to `part` (appended to its `have` bytes when the server honoured the
    Range, from the start when it did not) and return the file's whole size as the server
    announced it (None when it did not). A web page (text/html, or a body that starts as HTML: a
    captive portal's login page sent with 200 OK) is refused before a byte of it is kept."""
    announced = response.headers.get("Content-Length")
    resumed = bool(have) and response.status_code == 206
    if "text/html" in response.headers.get("Content-Type", "").lower():
        raise ModelError(WEB_PAGE.format(name=remote.name))
    if have and not resumed:  # the server ignored the Range: it sends the whole file
        meter.found(remote.name, -have)
    chunks, head = response.iter_bytes(), b""
    for chunk in chunks:  # the first bytes, enough to tell a web page from the file
        head += chunk
        if len(head) >= 512:
            break
    if looks_like_web_page(head):
        raise ModelError(WEB_PAGE.format(name=remote.name))
    with part.open("ab" if resumed else "wb") as handle:
        for chunk in _chained(head, chunks):  # as it arrives: a buffer would be lost on a drop
            if cancel.is_set():
                raise Cancelled(f"download of {remote.name} cancelled; pull again to resume")
            handle.write(chunk)
            meter.got(remote.name, len(chunk))
    if announced is None or not announced.isdigit():
        return remote.size
    return int(announced) + (have if resumed else 0)


def _chained(head: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if head:
        yield head
    yield from rest


def _verify(part: Path, remote: RemoteFile, expected: int | None) -> None:
    """Check a finished `part`: its size against `expected` (the hub's, else the server's; None:
    unknown), its hash when the hub gave one, and its content (`engine.models.verify.check_file`).
    A part that is short is kept for a resume; one that is wrong is deleted. Raises ModelError."""
    if not part.is_file():
        raise ModelError(f"the server sent nothing for {remote.name}; pull again, or try another mirror (HF_ENDPOINT)")
    size = part.stat().st_size
    if expected is not None and size < expected:
        raise ModelError(f"the connection ended {expected - size:,} bytes before the end of {remote.name}; "
                         "pull again to resume")
    if remote.sha256:
        hash_expected, digest = remote.sha256, hashlib.sha256()
    elif remote.blob_id:
        hash_expected, digest = remote.blob_id, hashlib.sha1(usedforsecurity=False)
        digest.update(f"blob {size}\0".encode())  # a git blob id hashes this header, then the content
    else:
        hash_expected, digest = None, None
    if digest is not None:
        with part.open("rb") as handle:
            for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
                digest.update(block)
    if (expected is not None and size != expected) or (digest is not None and digest.hexdigest() != hash_expected):
        part.unlink()
        raise ModelError(f"{remote.name} arrived damaged (its size or checksum differs from the hub's); "
                         "it was deleted: pull again to download it afresh")
    try:
        check_file(part, remote.name)
    except ModelError as exc:
        part.unlink()
        raise ModelError(f"{exc}; it was deleted" if "web page" not in str(exc) else str(exc)) from None


def _forget_other_commit(folder: Path, commit: str) -> None:
    """Files from another commit cannot be resumed or kept: start the folder afresh for `commit`."""
    stamp = folder / ".halaman-commit"
    if stamp.is_file() and stamp.read_text().strip() != commit:
        for path in folder.iterdir():
            if path.is_file():
                path.unlink()
    stamp.write_text(commit)


def _hub_error(repo: str, exc: Exception, endpoint: str) -> ModelError:
    """One line for a failed request to `endpoint`; a hub other than huggingface.co is named, so
    that an HF_ENDPOINT left set (the demo hub in the README) is not taken for a network fault."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, OfflineModeIsEnabled):
        return ModelError("downloads are off (HF_HUB_OFFLINE is set); unset it to download a model")
    if isinstance(exc, GatedRepoError):
        return ModelError(f"{repo} asks you to accept its licence: do so on its hub page, then log in with "
                          "`hf auth login` (or set HF_TOKEN) and pull again")
    if isinstance(exc, RevisionNotFoundError):
        return ModelError(f"{repo} has no such revision; leave the revision at main")
    hub = "the hub" if endpoint == constants.ENDPOINT.rstrip("/") else f"the hub at {endpoint} (HF_ENDPOINT)"
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(f"{repo} was not found on {hub} (or is private: log in with `hf auth login`)")
    return ModelError(f"could not reach {hub} for {repo} ({type(exc).__name__}); check your connection")


class _Meter:
    """Counts bytes over all files and reports DownloadProgress with speed and time left."""

    def __init__(self, repo: str, total_bytes: int, callback: Callable[[DownloadProgress], None] | None) -> None:
        self.repo, self.total, self.callback = repo, total_bytes, callback
        self.done = 0              # bytes on disk, all files
        self.received = 0          # bytes that came over the network in this pull
        self.file = ""
        self.samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])  # (time, received)
        self.last_report = 0.0

    def found(self, file: str, n_bytes: int) -> None:
        """`n_bytes` of `file` were already on disk (negative: a partial was dropped); not speed."""
        self.done += n_bytes
        self.file = file
        self._maybe_report()

    def got(self, file: str, n_bytes: int) -> None:
        """`n_bytes` of `file` just arrived."""
        self.done += n_bytes
        self.received += n_bytes
        self.file = file
        now = time.monotonic()
        self.samples.append((now, self.received))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.popleft()
        self._maybe_report()

    def verifying(self, file: str) -> None:
        """`file` is complete and about to be hashed: say so now (not throttled), since hashing a
        large file takes a while and the last byte count may read "100 %" a few bytes short."""
        self.file = file
        self._report(time.monotonic(), verifying=True)

    def finish(self) -> None:
        self._report(time.monotonic())

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now - self.last_report >= PROGRESS_EVERY_S:
            self._report(now)

    def _report(self, now: float, *, verifying: bool = False) -> None:
        self.last_report = now
        if self.callback is None:
            return
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        speed = (b1 - b0) / (t1 - t0) if t1 > t0 and b1 > b0 else 0.0
        left = max(0, self.total - self.done)
        eta = left / speed if speed else (0.0 if not left else None)
        self.callback(DownloadProgress(self.repo, self.file, self.done, self.total, speed, eta, verifying))
