"""A whole read stopped half-way (paused, cancelled, the app closed) goes on from its checkpoint in the
prefix store, in this process or after a restart, and saves what a read in one go saves
(`engine.read_checkpoint`). The reference is a read in one go of the same document: its snapshot's
tensors and its archive's bytes and digest, compared exactly."""

import threading

import pytest
import torch
from test_recall_archive import rope, write_archive  # noqa: F401 - rope is a fixture
from test_span_recall import book, settings

from engine import read_checkpoint
from engine.errors import Cancelled
from engine.kvcache.archive import Archive, ArchiveError, ArchiveWriter
from engine.prefix_store import PrefixStore, checkpoint_key
from engine.session import DocumentSession

BUDGET = 512 * 1024**2
# One thread: the reference and the resumed read must sum in the same order to give the same bits.
SETTINGS = settings().replace(threads=1)
CHUNK = SETTINGS.cache.chunk_tokens
STOP_AFTER = 3  # chunks read before the read stops


@pytest.fixture(scope="module")
def reference(smol, tmp_path_factory):
    """What a read in one go saves: (snapshot tensors, archive bytes, archive digest, document tokens)."""
    store = PrefixStore(tmp_path_factory.mktemp("straight"), disk_budget_bytes=BUDGET)
    session = DocumentSession(smol, SETTINGS, store)
    n = session.open(book(), read_now=False).document_tokens
    assert session.read() is True
    return saved(store, session.prefix_key) + (n,)


def saved(store, key):
    tensors, _meta = store.get(key)
    path, digest = store.archive(key)
    return tensors, path.read_bytes(), digest


def assert_saves_what_a_straight_read_saves(store, key, reference):
    tensors, archive, digest = saved(store, key)
    ref_tensors, ref_archive, ref_digest, _n = reference
    assert tensors.keys() == ref_tensors.keys()
    different = [name for name in tensors if not torch.equal(tensors[name], ref_tensors[name])]
    assert different == [], "the resumed read's snapshot differs"
    assert digest == ref_digest and archive == ref_archive
    assert store.checkpoint_tokens(key) == 0 and len(store.entries()) == 1, "the checkpoint is gone once read"
    assert not list(store.root.glob(f"*{checkpoint_key(key)}*")) and not list(store.root.glob(".*.tmp"))


def stop_after(event, chunks=STOP_AFTER):
    """A progress callback that sets `event` after `chunks` chunks."""
    seen = []

    def progress(p):
        seen.append(p.done)
        if len(seen) == chunks:
            event.set()

    return progress


def paused_and_closed(smol, root):
    """Read STOP_AFTER chunks of the book index first, pause, close the session; returns the key."""
    store = PrefixStore(root, disk_budget_bytes=BUDGET)
    session = DocumentSession(smol, SETTINGS, store)
    session.open(book(), read_now=False)
    pause = threading.Event()
    assert session.read(progress=stop_after(pause), pause=pause) is False
    key = session.prefix_key
    session.close()
    assert store.checkpoint_tokens(key) == STOP_AFTER * CHUNK
    store.close()
    return key


def read_after_restart(smol, root):
    """A new store and session over `root` (a restart): open the book index first and read it whole;
    returns (store, report, progress `done` of each chunk the read ran)."""
    store = PrefixStore(root, disk_budget_bytes=BUDGET)
    session = DocumentSession(smol, SETTINGS, store)
    report = session.open(book(), read_now=False)
    assert session.unread_progress() == (report.read_from, report.document_tokens)
    done = []
    assert session.read(progress=lambda p: done.append(p.done)) is True
    return store, report, done


def test_a_read_paused_and_closed_goes_on_after_a_restart_and_saves_what_a_straight_read_saves(smol, reference, tmp_path):
    key = paused_and_closed(smol, tmp_path / "prefix")
    store, report, done = read_after_restart(smol, tmp_path / "prefix")
    n = reference[3]
    assert report.read_from == STOP_AFTER * CHUNK, "the open shows where the read goes on"
    assert done[0] == (STOP_AFTER + 1) * CHUNK and done[-1] == n, "only the chunks not read yet are read"
    assert len(done) == -(-(n - STOP_AFTER * CHUNK) // CHUNK)
    assert_saves_what_a_straight_read_saves(store, key, reference)


def test_a_cancelled_read_keeps_the_chunks_before_the_cancelled_one(smol, reference, tmp_path):
    store = PrefixStore(tmp_path / "prefix", disk_budget_bytes=BUDGET)
    session = DocumentSession(smol, SETTINGS, store)
    n = session.open(book(), read_now=False).document_tokens
    cancel = threading.Event()
    with pytest.raises(Cancelled):  # set after the third chunk: the fourth stops half-way
        session.read(progress=stop_after(cancel), cancel=cancel)
    assert session.unread_progress() == (STOP_AFTER * CHUNK, n)
    assert store.checkpoint_tokens(session.prefix_key) == STOP_AFTER * CHUNK
    done = []
    assert session.read(progress=lambda p: done.append(p.done)) is True
    assert done[0] == (STOP_AFTER + 1) * CHUNK
    assert_saves_what_a_straight_read_saves(store, session.prefix_key, reference)


def test_a_read_killed_inside_a_chunk_goes_on_from_its_last_periodic_checkpoint(smol, reference, tmp_path, monkeypatch):
    """A crash runs no handler: what is on disk is the last periodic checkpoint, and an archive
    written past it (half a chunk's layers) that the next read writes again."""
    monkeypatch.setattr(read_checkpoint, "CHECKPOINT_EVERY_S", 0.0)  # a checkpoint after every chunk
    key = killed_read(smol, tmp_path / "prefix", monkeypatch)
    store, report, done = read_after_restart(smol, tmp_path / "prefix")
    assert report.read_from == STOP_AFTER * CHUNK and done[0] == (STOP_AFTER + 1) * CHUNK
    assert_saves_what_a_straight_read_saves(store, key, reference)


def killed_read(smol, root, monkeypatch, each_layer=lambda: None) -> str:
    """Read the book index first in a store at `root` and kill the read (no handler runs) half-way
    through chunk STOP_AFTER + 1, calling `each_layer()` as each layer's archive is written;
    returns the document's prefix key. The archive writer is whole again afterwards."""
    monkeypatch.setattr(read_checkpoint.ReadCheckpoints, "stopped", lambda self, writer: None)  # killed: nothing runs
    layers, appends = smol.decoder.shape.num_layers, []
    append = ArchiveWriter.append

    def dying(self, *args):
        appends.append(1)
        each_layer()
        if len(appends) == STOP_AFTER * layers + layers // 2:
            raise SystemExit("killed")
        return append(self, *args)

    monkeypatch.setattr(ArchiveWriter, "append", dying)
    session = DocumentSession(smol, SETTINGS, PrefixStore(root, disk_budget_bytes=BUDGET))
    session.open(book(), read_now=False)
    with pytest.raises(SystemExit):
        session.read()
    monkeypatch.setattr(ArchiveWriter, "append", append)
    return session.prefix_key


class ReadingClock:
    """`time.monotonic` for engine.read_checkpoint: `seconds_per_layer` pass with each layer the
    archive is written (a chunk of the default model: 30 layers), so a test reads for minutes."""

    def __init__(self, seconds_per_layer: float) -> None:
        self.now, self.step = 1000.0, seconds_per_layer

    def monotonic(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.step


def test_a_read_killed_in_its_first_minute_goes_on_from_an_early_checkpoint(smol, reference, tmp_path, monkeypatch):
    """Issue 45: a read killed in its first 60 s kept nothing (the first checkpoint came after 60 s
    of reading). With chunks of 6 s, killed inside the fourth (21 s in): the checkpoints after 6 s
    and 18 s of reading were saved, and the next read goes on from the third chunk's end."""
    clock = ReadingClock(6.0 / smol.decoder.shape.num_layers)
    monkeypatch.setattr(read_checkpoint, "time", clock)
    key = killed_read(smol, tmp_path / "prefix", monkeypatch, each_layer=clock.tick)
    assert clock.now - 1000.0 < read_checkpoint.CHECKPOINT_EVERY_S, "killed within the first minute"
    store, report, done = read_after_restart(smol, tmp_path / "prefix")
    assert report.read_from == STOP_AFTER * CHUNK and done[0] == (STOP_AFTER + 1) * CHUNK
    assert_saves_what_a_straight_read_saves(store, key, reference)


@pytest.mark.parametrize("part", ["snapshot", "archive"])
def test_a_damaged_checkpoint_is_dropped_and_the_read_starts_at_token_0(smol, reference, tmp_path, part):
    key = paused_and_closed(smol, tmp_path / "prefix")
    name = f"{checkpoint_key(key)}.safetensors" if part == "snapshot" else f"{checkpoint_key(key)}.archive.safetensors"
    path = tmp_path / "prefix" / name
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if part == "snapshot" else Archive.open(path)._places["layer0.k.codes"][0] + 7  # a token read
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    store, _report, done = read_after_restart(smol, tmp_path / "prefix")
    assert done[0] == CHUNK, "the read started over"
    assert_saves_what_a_straight_read_saves(store, key, reference)


def test_clearing_the_cache_deletes_the_checkpoint(smol, tmp_path):
    key = paused_and_closed(smol, tmp_path / "prefix")
    store = PrefixStore(tmp_path / "prefix", disk_budget_bytes=BUDGET)
    assert {entry.key for entry in store.entries()} == {checkpoint_key(key)}
    assert store.entries()[0].archive_bytes > 0, "the disk budget counts the archive being written"
    store.clear()
    assert store.checkpoint_tokens(key) == 0 and not list(store.root.glob("*.safetensors"))
    store.close()
    _store, report, done = read_after_restart(smol, tmp_path / "prefix")
    assert report.read_from == 0 and done[0] == CHUNK


def test_an_archive_writer_resumed_half_way_writes_the_file_a_straight_writer_writes(tmp_path, rope):  # noqa: F811
    layout, keys, values, digest = write_archive(tmp_path / "straight", rope, 512)
    half = 256
    writer = ArchiveWriter(tmp_path / "resumed", layout, rope)
    for start in range(0, half, 128):
        for layer in range(layout.num_layers):
            writer.append(layer, start, keys[layer, :, start:start + 128], values[layer, :, start:start + 128])
    digests = {name: t.clone() for name, t in writer.digests().items()}
    writer.close()
    with pytest.raises(ArchiveError):  # damaged digests: the file differs from them
        ArchiveWriter.resume(tmp_path / "resumed", layout, rope, half, {**digests, "bounds": digests["bounds"] ^ 1})
    writer = ArchiveWriter.resume(tmp_path / "resumed", layout, rope, half, digests)
    for start in range(half, 512, 128):
        for layer in range(layout.num_layers):
            writer.append(layer, start, keys[layer, :, start:start + 128], values[layer, :, start:start + 128])
    assert writer.finish()[0] == digest
    assert (tmp_path / "resumed").read_bytes() == (tmp_path / "straight").read_bytes()
