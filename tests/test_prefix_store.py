"""PrefixStore and prefix_key: identity (L03, L04), integrity (L04), atomic writes, LRU, two processes.
L01-L04 are the prefix-cache pitfalls from llama.cpp bug reports listed in docs/CORPUS.md."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlite_utils
import torch

from engine.errors import CacheStoreError, SettingsError
from engine.prefix_store import (
    FORMAT_VERSION, PrefixStore, PrefixTooLargeError, clear_files, open_store, prefix_key,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "model_fingerprint": "sha256:model-aaaa",
    "tokenizer_fingerprint": "sha256:tok-bbbb",
    "token_ids": [1, 50, 700, 9000, 2],
    "policy": {
        "budget_tokens": 2048,
        "sink_tokens": 4,
        "window_tokens": 256,
        "kv_bits": 4,
        "group_size": 64,
        "residual_tokens": 128,
        "position_mode": "original",
    },
    "dtype": "bfloat16",
    "extra": {"transformers": "5.24.0", "rope_theta": "100000.0"},
}


def key_for(**overrides) -> str:
    return prefix_key(**{**BASE, **overrides})


def snapshot(seed: int, n_tokens: int = 8) -> dict[str, torch.Tensor]:
    """A small stand-in for a compressed cache: codes, scales and a residual of different dtypes."""
    g = torch.Generator().manual_seed(seed)
    return {
        "layer0.codes": torch.randint(0, 256, (3, n_tokens, 32), generator=g, dtype=torch.uint8),
        "layer0.scales": torch.randn(3, n_tokens, 2, generator=g).to(torch.float16),
        "layer0.residual": torch.randn(3, n_tokens, 64, generator=g).to(torch.bfloat16),
        "positions": torch.arange(n_tokens, dtype=torch.int64),
    }


def files_in(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if not p.name.startswith("index.sqlite")}


def index(root: Path) -> sqlite_utils.Database:
    return sqlite_utils.Database(root / "index.sqlite")


# -- prefix_key ------------------------------------------------------------------------------------


MUTATIONS = {
    **{
        f"policy.{name}": {"policy": {**BASE["policy"], name: value}}
        for name, value in {
            "budget_tokens": 2049,
            "sink_tokens": 5,
            "window_tokens": 255,
            "kv_bits": 8,
            "group_size": 32,
            "residual_tokens": 0,
            "position_mode": "compact",
        }.items()
    },
    "policy.new_field": {"policy": {**BASE["policy"], "heavy_ratio": 0.5}},
    "one token id": {"token_ids": [1, 50, 701, 9000, 2]},
    "token order": {"token_ids": [1, 700, 50, 9000, 2]},
    "dtype": {"dtype": "float16"},
    "model fingerprint": {"model_fingerprint": "sha256:model-aaab"},
    "tokenizer fingerprint": {"tokenizer_fingerprint": "sha256:tok-bbbc"},
    "extra value": {"extra": {**BASE["extra"], "rope_theta": "10000.0"}},
    "extra new item": {"extra": {**BASE["extra"], "rope_scaling": "none"}},
    "no extra": {"extra": None},
    # Field boundaries must not be movable: "ab"+"c" vs "a"+"bc".
    "shifted fingerprints": {"model_fingerprint": "sha256:model-aaaas", "tokenizer_fingerprint": "ha256:tok-bbbb"},
    # int64 encoding: a large id must not alias two small ones.
    "large token id": {"token_ids": [1, 50, 700, 9000 + (2 << 32)]},
}


@pytest.mark.parametrize("change", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_key_changes_when_any_input_changes(change):
    assert key_for(**change) != key_for()


@pytest.mark.parametrize("change", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_the_config_signature_changes_exactly_when_a_field_other_than_the_token_ids_does(change):
    """The library's "stale" (engine.library) compares these: the prefix key's own fields, ids aside."""
    from engine.prefix_store import PrefixConfig

    fields = {**BASE, **change}
    config = PrefixConfig(**{name: value for name, value in fields.items() if name != "token_ids"})
    assert config.key(fields["token_ids"]) == key_for(**change)
    base = PrefixConfig(**{name: value for name, value in BASE.items() if name != "token_ids"})
    assert (config.signature == base.signature) == ("token_ids" in change) and len(config.signature) == 64


def test_all_mutated_keys_are_distinct():
    keys = [key_for(**change) for change in MUTATIONS.values()]
    assert len(set(keys)) == len(keys)


def test_key_is_deterministic_and_ignores_mapping_order():
    reordered_policy = dict(reversed(list(BASE["policy"].items())))
    assert key_for(policy=reordered_policy) == key_for()
    assert key_for(token_ids=torch.tensor(BASE["token_ids"])) == key_for()
    assert key_for(extra={}) == prefix_key(**{**BASE, "extra": None})
    key = key_for()
    assert len(key) == 64 and int(key, 16) >= 0


def test_key_follows_the_documented_encoding():
    """Recompute the key from prefix_key's docstring, byte for byte."""
    header = json.dumps(
        {
            "format_version": FORMAT_VERSION,
            "model_fingerprint": BASE["model_fingerprint"],
            "tokenizer_fingerprint": BASE["tokenizer_fingerprint"],
            "policy": BASE["policy"],
            "dtype": BASE["dtype"],
            "extra": BASE["extra"],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("ascii")
    ids = BASE["token_ids"]
    payload = (
        b"halaman.prefix_key\x00"
        + len(header).to_bytes(8, "little")
        + header
        + len(ids).to_bytes(8, "little")
        + b"".join(i.to_bytes(8, "little", signed=True) for i in ids)
    )
    assert key_for() == hashlib.sha256(payload).hexdigest()


def test_key_pinned_value():
    # If this fails the key encoding changed: bump FORMAT_VERSION and update the value, so entries
    # written by older versions miss instead of being read under a new meaning.
    assert FORMAT_VERSION == 1
    assert key_for() == "055f84891c46456a16be696d45683b295ccc4b867d62e5fa3edc23755777a3a5"


def test_key_is_stable_across_processes():
    code = textwrap.dedent(
        """
        import json, sys
        from engine.prefix_store import prefix_key
        print(prefix_key(**json.loads(sys.argv[1])))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(BASE)], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert result.stdout.strip() == key_for()


def test_one_remaining_token_case_gives_three_keys_and_no_prefix_hits(tmp_path):
    """L04: the cache for [a,b,c] must not be served for [a,b] or [a,b,c,d]."""
    a, b, c, d = 101, 202, 303, 404
    keys = [key_for(token_ids=ids) for ids in ([a, b, c], [a, b], [a, b, c, d])]
    assert len(set(keys)) == 3
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    store.put(keys[0], snapshot(0, 3), {}, n_tokens=3, label="abc")
    assert store.get(keys[1]) is None
    assert store.get(keys[2]) is None
    assert store.get(keys[0]) is not None


def test_key_rejects_bad_inputs():
    with pytest.raises(ValueError):
        key_for(token_ids=[1, 2**63])
    with pytest.raises(ValueError):
        key_for(policy={**BASE["policy"], "heavy_ratio": float("nan")})
    with pytest.raises(TypeError):
        key_for(extra={"rope_theta": 100000.0})
    with pytest.raises(TypeError):
        key_for(dtype=torch.bfloat16)


# -- round trip ------------------------------------------------------------------------------------


def test_round_trip_preserves_values_dtypes_shapes_and_metadata(tmp_path):
    base = torch.arange(24, dtype=torch.float32)
    tensors = {
        "i32": torch.tensor([[-(2**31), 0, 2**31 - 1]], dtype=torch.int32),
        "i64": torch.tensor([-(2**63), 7, 2**63 - 1], dtype=torch.int64),
        "u8": torch.arange(256, dtype=torch.uint8),
        "f16": torch.tensor([1.5, -0.0, float("inf")], dtype=torch.float16),
        "f32": torch.randn(4, 5),
        "bf16": torch.randn(2, 3, 4).to(torch.bfloat16),
        "empty_bf16": torch.empty(0, 3, 64, dtype=torch.bfloat16),
        "empty_i64": torch.empty(0, dtype=torch.int64),
        "scalar": torch.tensor(3.25),
        "transposed": torch.randn(3, 5).t(),
        # Two views of one buffer (keys and values sliced from one pool): safetensors refuses
        # aliases, the store must still save both.
        "head": base[:12].view(3, 4),
        "tail": base[12:].view(3, 4),
    }
    metadata = {"title": "Bab 1 — Pendahuluan", "model": "SmolLM2-135M", "empty": ""}
    key = key_for()
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    entry = store.put(key, tensors, metadata, n_tokens=5, label="doc.pdf · SmolLM2")

    loaded = store.get(key)
    assert loaded is not None
    got, got_metadata = loaded
    assert got_metadata == metadata
    assert set(got) == set(tensors)
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name

    assert entry.key == key and entry.n_tokens == 5 and entry.label == "doc.pdf · SmolLM2"
    assert entry.path == tmp_path / f"{key}.safetensors"
    assert entry.size_bytes == entry.path.stat().st_size
    assert entry.sha256 == hashlib.sha256(entry.path.read_bytes()).hexdigest()
    assert store.total_bytes() == entry.size_bytes


def test_file_header_carries_key_n_tokens_and_format_version(tmp_path):
    from safetensors import safe_open

    key = key_for()
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    entry = store.put(key, snapshot(1), {"title": "t"}, n_tokens=5, label="x")
    with safe_open(str(entry.path), framework="pt") as f:
        header = f.metadata()
    assert header == {
        "title": "t",
        "halaman.key": key,
        "halaman.n_tokens": "5",
        "halaman.format_version": str(FORMAT_VERSION),
    }
    row = index(tmp_path)["prefixes"].get(key)
    assert row["n_tokens"] == 5


def test_put_replaces_an_existing_entry(tmp_path):
    key = key_for()
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    store.put(key, snapshot(1), {"v": "1"}, n_tokens=5, label="x")
    store.put(key, snapshot(2), {"v": "2"}, n_tokens=5, label="x")
    tensors, metadata = store.get(key)
    assert metadata == {"v": "2"}
    assert torch.equal(tensors["layer0.codes"], snapshot(2)["layer0.codes"])
    assert len(store.entries()) == 1


def test_invalid_arguments_are_refused(tmp_path):
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    with pytest.raises(ValueError):
        store.get("../../etc/passwd")
    with pytest.raises(ValueError):
        store.put(key_for(), snapshot(0), {"halaman.key": "x"}, n_tokens=5, label="x")
    with pytest.raises(TypeError):
        store.put(key_for(), snapshot(0), {"n": 5}, n_tokens=5, label="x")
    with pytest.raises(ValueError):
        store.put(key_for(), snapshot(0), {}, n_tokens=-1, label="x")
    with pytest.raises(SettingsError):
        PrefixStore(tmp_path, disk_budget_bytes=-1)
    assert files_in(tmp_path) == set()


# -- corruption (L04) ------------------------------------------------------------------------------


def stored(tmp_path, seed: int = 0, **overrides) -> tuple[PrefixStore, str, Path]:
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    key = key_for(**overrides)
    entry = store.put(key, snapshot(seed), {"title": "t"}, n_tokens=5, label="x")
    return store, key, entry.path


def assert_dropped(store: PrefixStore, key: str, tmp_path: Path) -> None:
    assert store.get(key) is None
    assert store.entries() == []
    assert not (tmp_path / f"{key}.safetensors").exists()
    assert files_in(tmp_path) == set()


@pytest.mark.parametrize("where", ["header", "data", "last byte"])
def test_flipped_byte_is_a_miss_and_the_entry_is_dropped(tmp_path, where):
    store, key, path = stored(tmp_path)
    data = bytearray(path.read_bytes())
    offset = {"header": 20, "data": len(data) // 2, "last byte": len(data) - 1}[where]
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    assert_dropped(store, key, tmp_path)


@pytest.mark.parametrize("keep", [0, 7, 100, -1])
def test_truncated_file_is_a_miss(tmp_path, keep):
    store, key, path = stored(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    assert_dropped(store, key, tmp_path)


def test_missing_file_is_a_miss_and_the_row_is_gone(tmp_path):
    store, key, path = stored(tmp_path)
    path.unlink()
    assert store.get(key) is None
    assert index(tmp_path)["prefixes"].count == 0


def test_valid_checksum_but_unparsable_file_is_a_miss(tmp_path):
    store, key, path = stored(tmp_path)
    garbage = b"\xff" * 64
    path.write_bytes(garbage)
    index(tmp_path)["prefixes"].update(key, {"size_bytes": 64, "sha256": hashlib.sha256(garbage).hexdigest()})
    assert_dropped(store, key, tmp_path)


def test_n_tokens_mismatch_between_row_and_header_is_a_miss(tmp_path):
    store, key, _ = stored(tmp_path)
    index(tmp_path)["prefixes"].update(key, {"n_tokens": 4})
    assert_dropped(store, key, tmp_path)


def test_file_swapped_under_another_key_is_a_miss(tmp_path):
    """A valid file for key A, placed (with a matching row) under key B, must not load as B (L03)."""
    store, key_a, path_a = stored(tmp_path, seed=1)
    key_b = key_for(dtype="float16")
    store.put(key_b, snapshot(2), {}, n_tokens=5, label="b")
    path_b = tmp_path / f"{key_b}.safetensors"
    path_b.write_bytes(path_a.read_bytes())
    row_a = index(tmp_path)["prefixes"].get(key_a)
    index(tmp_path)["prefixes"].update(key_b, {"size_bytes": row_a["size_bytes"], "sha256": row_a["sha256"]})
    assert store.get(key_b) is None
    assert not path_b.exists()
    assert store.get(key_a) is not None


@pytest.mark.parametrize("garbage", ["../victim.safetensors", "/nonexistent/dir/x.safetensors", "", "\x00"])
def test_garbage_row_path_is_a_miss_and_never_deletes_outside_the_store(tmp_path, garbage):
    root = tmp_path / "store"
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"not ours")
    store, key, _ = stored(root)
    index(root)["prefixes"].update(key, {"file": garbage})
    assert store.get(key) is None
    assert store.entries() == []
    assert victim.read_bytes() == b"not ours"
    # Reopening with such a row must not crash either.
    index(root)["prefixes"].insert({**_row(key), "file": garbage}, replace=True)
    assert PrefixStore(root, disk_budget_bytes=10**7).entries() == []
    assert victim.exists()


def _row(key: str) -> dict:
    return {
        "key": key,
        "file": f"{key}.safetensors",
        "n_tokens": 1,
        "size_bytes": 1,
        "created_s": 0.0,
        "last_used_s": 0.0,
        "label": "",
        "sha256": "0" * 64,
    }


def damage(root: Path, how: str) -> bytes:
    """B06 (a) 4 KiB of zeros over the index, (b) the real index cut to its first 1 KiB."""
    index_path = root / "index.sqlite"
    for side in root.glob("index.sqlite-*"):
        side.unlink()  # a closed store has checkpointed its WAL into the index
    data = bytes(4096) if how == "zeros" else index_path.read_bytes()[:1024]
    index_path.write_bytes(data)
    return data


@pytest.mark.parametrize("how", ["zeros", "truncated"])
def test_b06_damaged_index_is_moved_aside_and_a_new_one_started(tmp_path, how):
    store, key, entry_path = stored(tmp_path)
    store.close()
    damaged = damage(tmp_path, how)

    healed = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    assert healed.notice.startswith("the prefix cache index was damaged (")
    assert (tmp_path / "index.sqlite.damaged").read_bytes() == damaged  # kept for inspection
    assert healed.entries() == [] and healed.get(key) is None
    assert not entry_path.exists()  # its row went with the old index: an orphan, cleaned
    healed.put(key, snapshot(3), {}, n_tokens=5, label="again")  # and the store works again
    assert [e.key for e in PrefixStore(tmp_path, disk_budget_bytes=10**7).entries()] == [key]


def test_clear_files_frees_everything_without_sqlite(tmp_path):
    store, key, entry_path = stored(tmp_path)
    store.close()
    damage(tmp_path, "zeros")
    (tmp_path / "notes.txt").write_text("not ours")
    (tmp_path / f"{key}.archive.safetensors").write_bytes(b"an archive beside its entry")
    assert clear_files(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_open_store_reports_an_unusable_folder_in_one_line(tmp_path):
    (tmp_path / "prefix").write_text("a file where the cache folder should be")
    store, notice = open_store(tmp_path / "prefix", disk_budget_bytes=10**7)
    assert store is None
    assert notice.startswith("the prefix cache cannot be used (") and "\n" not in notice


# -- a full disk (B06 c): a real tmpfs in a private mount namespace --------------------------------

UNSHARE = shutil.which("unshare")


def _can_mount_tmpfs() -> bool:
    if UNSHARE is None:
        return False
    probe = subprocess.run([UNSHARE, "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _can_mount_tmpfs(), reason="cannot mount a tmpfs (no user namespaces)")


def in_full_tmpfs(home: Path, size: str, script: str, **env: str) -> subprocess.CompletedProcess:
    """Run `script` (Python) with HALAMAN_HOME=home, whose cache/prefix is a tmpfs of `size` that
    the script may fill; the mount exists only for that process tree."""
    prefix = home / "cache" / "prefix"
    prefix.mkdir(parents=True)
    env = dict(os.environ, HALAMAN_HOME=str(home), PYTHONPATH=str(REPO_ROOT), **env)
    command = f'mount -t tmpfs -o size={size} tmpfs "{prefix}" && exec "{sys.executable}" -c "$0"'
    return subprocess.run([UNSHARE, "--user", "--map-root-user", "--mount", "sh", "-c", command, script],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT)


FILL_THEN_CLI = textwrap.dedent("""
    import os, subprocess, sys, torch
    from pathlib import Path
    from engine.prefix_store import PrefixStore
    root = Path(os.environ["HALAMAN_HOME"]) / "cache" / "prefix"
    store = PrefixStore(root, disk_budget_bytes=10**8)
    for i in range(3):
        store.put(f"{i:064x}", {"x": torch.zeros(100, 100)}, {}, n_tokens=5, label=f"doc {i}")
    store.close()
    assert os.statvfs(root).f_blocks * os.statvfs(root).f_frsize <= 1 << 20  # only ever fill the tmpfs
    with open(root / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096)); f.flush()
        except OSError:
            pass
    print("before", os.statvfs(root).f_bavail)
    for action in ("list", "clear"):
        out = subprocess.run([sys.executable, "-m", "engine.cli", "cache", action, *(["--yes"] if action == "clear" else [])],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        print(action, out.returncode, out.stdout.strip(), "|", out.stderr.strip())
    print("left", sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors")))
    print("after", os.statvfs(root).f_bavail)
""")


@needs_tmpfs
def test_b06_full_disk_cache_list_and_clear_exit_0_and_clear_frees_the_space(tmp_path):
    out = in_full_tmpfs(tmp_path / "home", "512k", FILL_THEN_CLI)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["before"] == "0"  # free blocks: the disk is full
    assert lines["list"].startswith("0 no entries can be listed")
    assert "warning: the prefix cache cannot be used (the disk holding it is full)" in lines["list"]
    assert lines["clear"].startswith("0 removed 3 prefix cache entries")
    assert lines["left"] == "[]"
    assert int(lines["after"]) > 0


# -- atomic writes -------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", ["os.replace", "os.fsync", "upsert"])
def test_crash_mid_write_leaves_no_entry_and_no_temp_file(tmp_path, monkeypatch, failing):
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    other = key_for(dtype="float16")
    store.put(other, snapshot(9), {}, n_tokens=5, label="other")

    def boom(*args, **kwargs):
        if failing == "upsert":
            raise sqlite3.OperationalError("disk I/O error (simulated)")
        raise OSError(28, "No space left on device (simulated)")

    if failing == "upsert":
        monkeypatch.setattr(sqlite_utils.db.Table, "upsert", boom)
    else:
        monkeypatch.setattr(os, failing.split(".")[1], boom)

    key = key_for()
    with pytest.raises(CacheStoreError):
        store.put(key, snapshot(0), {}, n_tokens=5, label="x")
    monkeypatch.undo()

    assert store.get(key) is None
    assert [e.key for e in store.entries()] == [other]
    assert files_in(tmp_path) == {f"{other}.safetensors"}
    assert store.get(other) is not None
    assert PrefixStore(tmp_path, disk_budget_bytes=10**7).get(key) is None


def test_failed_rename_keeps_the_previous_entry(tmp_path, monkeypatch):
    store, key, _ = stored(tmp_path, seed=1)

    def boom(*args, **kwargs):
        raise OSError(5, "Input/output error (simulated)")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(CacheStoreError):
        store.put(key, snapshot(2), {"title": "new"}, n_tokens=5, label="x")
    monkeypatch.undo()
    tensors, metadata = store.get(key)
    assert metadata == {"title": "t"}
    assert torch.equal(tensors["layer0.codes"], snapshot(1)["layer0.codes"])


def test_open_cleans_orphans_and_stale_temp_files_but_not_fresh_ones(tmp_path):
    store, key, _ = stored(tmp_path)
    gone_key = key_for(dtype="gone")
    store.put(gone_key, snapshot(3), {}, n_tokens=5, label="gone")
    (tmp_path / f"{gone_key}.safetensors").unlink()  # row without file
    orphan_key = key_for(dtype="orphan")
    orphan = tmp_path / f"{orphan_key}.safetensors"  # file without row
    orphan.write_bytes(b"left behind")
    stale = tmp_path / f".{orphan_key}.999.abcd1234.tmp"  # a crashed writer's temp file
    stale.write_bytes(b"partial")
    old_s = time.time() - 2 * 3600
    os.utime(stale, (old_s, old_s))
    fresh = tmp_path / f".{orphan_key}.998.abcd1234.tmp"  # maybe another process writing now
    fresh.write_bytes(b"partial")
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("not ours")

    reopened = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    assert [e.key for e in reopened.entries()] == [key]
    assert not orphan.exists() and not stale.exists()
    assert fresh.exists() and unrelated.exists()
    assert reopened.get(key) is not None


def test_clear_removes_everything_including_orphans(tmp_path):
    store = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    for i in range(2):
        store.put(key_for(dtype=f"d{i}"), snapshot(i), {}, n_tokens=5, label=str(i))
    orphan_key = key_for(dtype="orphan")
    (tmp_path / f"{orphan_key}.safetensors").write_bytes(b"orphan")
    (tmp_path / f".{orphan_key}.123.beef.tmp").write_bytes(b"fresh temp")
    (tmp_path / "notes.txt").write_text("not ours")

    assert store.clear() == 3
    assert store.entries() == [] and store.total_bytes() == 0
    assert files_in(tmp_path) == {"notes.txt"}
    assert store.clear() == 0


def test_delete(tmp_path):
    store, key, path = stored(tmp_path)
    assert store.delete(key) is True
    assert not path.exists() and store.get(key) is None
    assert store.delete(key) is False


# -- LRU under a disk budget -----------------------------------------------------------------------


def entry_size(tmp_path: Path) -> int:
    probe = PrefixStore(tmp_path / "probe", disk_budget_bytes=10**7)
    return probe.put(key_for(dtype="probe"), snapshot(0), {}, n_tokens=5, label="probe").size_bytes


@pytest.mark.parametrize("touch_a", [True, False])
def test_lru_evicts_least_recently_used(tmp_path, touch_a):
    size = entry_size(tmp_path)
    store = PrefixStore(tmp_path / "s", disk_budget_bytes=2 * size + size // 2)
    a, b, c = (key_for(dtype=name) for name in "abc")
    store.put(a, snapshot(1), {}, n_tokens=5, label="a")
    store.put(b, snapshot(2), {}, n_tokens=5, label="b")
    if touch_a:
        assert store.get(a) is not None
    store.put(c, snapshot(3), {}, n_tokens=5, label="c")

    evicted, kept = (b, a) if touch_a else (a, b)
    assert [e.key for e in store.entries()] == [c, kept]
    assert store.get(evicted) is None
    assert not (tmp_path / "s" / f"{evicted}.safetensors").exists()
    assert store.total_bytes() <= store.disk_budget_bytes


def test_entry_just_written_is_never_evicted(tmp_path):
    size = entry_size(tmp_path)
    store = PrefixStore(tmp_path / "s", disk_budget_bytes=size)
    a, b = key_for(dtype="a"), key_for(dtype="b")
    store.put(a, snapshot(1), {}, n_tokens=5, label="a")
    # Another process whose clock runs ahead may leave `a` looking newer than anything we write.
    index(tmp_path / "s")["prefixes"].update(a, {"last_used_s": time.time() + 3600})
    store.put(b, snapshot(2), {}, n_tokens=5, label="b")
    assert [e.key for e in store.entries()] == [b]
    assert store.get(b) is not None


def test_entry_larger_than_budget_is_refused_without_evicting(tmp_path):
    size = entry_size(tmp_path)
    store = PrefixStore(tmp_path / "s", disk_budget_bytes=size + 10)
    small = key_for(dtype="small")
    store.put(small, snapshot(1), {}, n_tokens=5, label="small")
    big = key_for(dtype="big")
    with pytest.raises(PrefixTooLargeError, match="budget"):
        store.put(big, snapshot(2, n_tokens=64), {}, n_tokens=64, label="big")
    assert [e.key for e in store.entries()] == [small]
    assert files_in(tmp_path / "s") == {f"{small}.safetensors"}


def test_lowered_budget_evicts_on_open(tmp_path):
    size = entry_size(tmp_path)
    root = tmp_path / "s"
    store = PrefixStore(root, disk_budget_bytes=10 * size)
    keys = [key_for(dtype=str(i)) for i in range(3)]
    for i, key in enumerate(keys):
        store.put(key, snapshot(i), {}, n_tokens=5, label=str(i))
    store.get(keys[0])
    store.close()
    reopened = PrefixStore(root, disk_budget_bytes=2 * size)
    assert [e.key for e in reopened.entries()] == [keys[0], keys[2]]


def test_entry_removed_by_another_store_instance_is_a_miss(tmp_path):
    store, key, _ = stored(tmp_path)
    other = PrefixStore(tmp_path, disk_budget_bytes=10**7)
    assert other.delete(key)
    assert store.get(key) is None


# -- two processes ---------------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, logging, random, sys, time, traceback
    from pathlib import Path
    import torch
    from engine.prefix_store import PrefixStore, prefix_key

    dropped = []

    class Recorder(logging.Handler):
        def emit(self, record):
            dropped.append(record.getMessage())

    logging.getLogger("engine.prefix_store").addHandler(Recorder(logging.WARNING))

    root, role, seed, go_file, ready_file, duration_s, budget = sys.argv[1:8]
    rng = random.Random(int(seed))

    def key(i):
        return prefix_key(model_fingerprint="m", tokenizer_fingerprint="t", token_ids=list(range(i + 1)),
                          policy={"budget_tokens": 64}, dtype="float32")

    def content(i):
        return {"k": torch.arange(4096, dtype=torch.float32) * (i + 1), "ids": torch.arange(i + 1)}, {"i": str(i)}

    Path(ready_file).touch()
    while not Path(go_file).exists():
        time.sleep(0.01)
    stats = {"puts": 0, "hits": 0, "misses": 0, "deletes": 0, "errors": []}
    try:
        store = PrefixStore(Path(root), disk_budget_bytes=int(budget))
        end = time.monotonic() + float(duration_s)
        while time.monotonic() < end:
            i = rng.randrange(8)
            action = rng.random()
            if role == "writer" and action < 0.5:
                tensors, metadata = content(i)
                store.put(key(i), tensors, metadata, n_tokens=i + 1, label=f"entry {i}")
                stats["puts"] += 1
            elif role == "writer" and action < 0.55:
                store.delete(key(i))
                stats["deletes"] += 1
            else:
                got = store.get(key(i))
                if got is None:
                    stats["misses"] += 1
                    continue
                tensors, metadata = got
                expected, expected_metadata = content(i)
                if metadata != expected_metadata or set(tensors) != set(expected) or not all(
                    torch.equal(tensors[n], expected[n]) for n in expected
                ):
                    stats["errors"].append(f"wrong data for entry {i}")
                stats["hits"] += 1
    except Exception:
        stats["errors"].append(traceback.format_exc())
    stats["dropped"] = dropped
    print(json.dumps(stats))
    """
)


def test_two_writers_and_readers_in_separate_processes(tmp_path):
    root = tmp_path / "store"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    go_file = tmp_path / "go"
    # An entry is ~16.5 KiB: a budget of ~3 of the 8 keys keeps eviction busy.
    budget = 3 * 17_000
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    roles = ["writer", "writer", "reader", "reader"]
    procs = []
    for n, role in enumerate(roles):
        ready = tmp_path / f"ready{n}"
        args = [str(root), role, str(n), str(go_file), str(ready), "1.5", str(budget)]
        procs.append(
            (ready, subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env))
        )
    deadline = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in procs):
        assert time.monotonic() < deadline, "workers did not start"
        assert all(p.poll() is None for _, p in procs), "a worker died during startup"
        time.sleep(0.05)
    go_file.touch()
    results = []
    for _, proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))

    for role, stats in zip(roles, results):
        assert stats["errors"] == [], (role, stats["errors"])
        # Rows and files only change together under the write lock, so a race must never make a
        # valid entry look corrupt and get it deleted.
        assert stats["dropped"] == [], (role, stats["dropped"])
    assert sum(s["puts"] for s in results) > 8
    assert sum(s["hits"] for s in results) > 0
    assert sum(s["misses"] for s in results) > 0

    store = PrefixStore(root, disk_budget_bytes=budget)
    entries = store.entries()
    assert entries, "nothing left in the store"
    assert store.total_bytes() <= budget
    for entry in entries:
        got = store.get(entry.key)
        assert got is not None, entry
        i = entry.n_tokens - 1
        assert got[1] == {"i": str(i)}
        assert torch.equal(got[0]["k"], torch.arange(4096, dtype=torch.float32) * (i + 1))
    assert files_in(root) == {f"{e.key}.safetensors" for e in entries}


ASK_ON_SMALL_DISK = textwrap.dedent("""
    import os, subprocess, sys
    from pathlib import Path
    root = Path(os.environ["HALAMAN_HOME"]) / "cache" / "prefix"
    doc = Path(os.environ["DOC"])
    ask = [sys.executable, "-m", "engine.cli", "ask", str(doc), "What is the code word?",
           "--max-new-tokens", "4", "--budget", "512", "--window", "128", "--read", "first"]  # saves the read
    def run(label):
        out = subprocess.run(ask, capture_output=True, text=True)
        warnings = [line for line in out.stderr.splitlines() if "prefix cache" in line]
        print(label, out.returncode, "||".join(warnings))
    run("room")  # the index fits, the snapshot does not: put fails after the prefill
    with open(root / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096))
        except OSError:
            pass
    run("full")  # the store cannot even be opened
""")


@needs_tmpfs
def test_b06_ask_goes_on_without_the_prefix_cache_and_says_so_once(tmp_path):
    """A real `halaman ask` (the embedded model) with its prefix cache on a 256 KiB tmpfs."""
    shared = Path(os.environ["HALAMAN_HOME"]) / "cache"
    shared.mkdir(parents=True, exist_ok=True)
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    (home / "cache" / "models").symlink_to(shared / "models", target_is_directory=True)  # converted once
    doc = tmp_path / "notes.md"
    doc.write_text("The meeting is on Tuesday. The code word is PELICAN.\n")
    out = in_full_tmpfs(home, "256k", ASK_ON_SMALL_DISK, DOC=str(doc))
    assert out.returncode == 0, out.stderr
    room, full = out.stdout.splitlines()
    assert room.startswith("room 0 warning: the prefix cache stopped working and is off for this session: "
                           "Could not save the prefix cache for 'notes.md")
    assert "||" not in room  # said once
    assert full == ("full 0 warning: the prefix cache cannot be used (the disk holding it is full), so it is off "
                    "for now: documents are prefilled every time")


def test_evicted_entries_are_named_once_least_recently_used_first(tmp_path):
    size = entry_size(tmp_path)
    store = PrefixStore(tmp_path / "s", disk_budget_bytes=2 * size + size // 2)
    for k, name in enumerate("abcd"):
        store.put(key_for(dtype=name), snapshot(k + 1), {}, n_tokens=5, label=f"{name}.pdf · model")
    assert store.take_evicted() == ["a.pdf · model", "b.pdf · model"]
    assert store.take_evicted() == [], "said once"
