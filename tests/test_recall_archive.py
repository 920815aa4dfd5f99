"""The archive (every token's K/V on disk) and recall's selection, against brute-force references."""

from dataclasses import replace

import pytest
import safetensors
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from engine.kvcache.archive import Archive, ArchiveError, ArchiveLayout, ArchiveWriter
from engine.kvcache.attention import RotaryTable, apply_rope
from engine.kvcache.cache import CacheShape, LayerKV, StepOptions
from engine.kvcache.quant import KVFormat
from engine.kvcache.sizes import archive_bytes
from engine.kvcache.recall import Recaller, RecalledTokens, block_upper_bounds, compact_order_positions, held_tokens, select_tokens
from engine.prefix_store import PrefixStore
from engine.settings import CachePolicy, EngineSettings, RecallSettings, load_settings, save_settings
from engine.errors import SettingsError

HEADS, GROUP, DIM, LAYERS = 3, 3, 64, 2


@pytest.fixture(scope="module")
def rope():
    config = LlamaConfig(hidden_size=HEADS * GROUP * DIM, num_attention_heads=HEADS * GROUP, num_key_value_heads=HEADS,
                         rope_theta=100000.0, max_position_embeddings=8192)
    return RotaryTable(LlamaRotaryEmbedding(config), DIM, torch.device("cpu"))


def write_archive(path, rope, n_tokens, *, bits=4, block=32, chunk=128, seed=0):
    """A real archive of random K/V; returns (layout, keys, values) with keys/values [L, H, n, D]."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn((LAYERS, HEADS, n_tokens, DIM), generator=gen) * 2
    values = torch.randn((LAYERS, HEADS, n_tokens, DIM), generator=gen)
    layout = ArchiveLayout(LAYERS, HEADS, DIM, n_tokens, block, bits, 32)
    writer = ArchiveWriter(path, layout, rope)
    for start in range(0, n_tokens, chunk):
        for layer in range(LAYERS):
            writer.append(layer, start, keys[layer, :, start:start + chunk], values[layer, :, start:start + chunk])
    sha, size = writer.finish()
    assert size == path.stat().st_size and len(sha) == 64
    return layout, keys, values, sha


@pytest.mark.parametrize("bits", [4, 2])
def test_archive_round_trips_bit_exactly_and_is_plain_safetensors(tmp_path, rope, bits):
    path = tmp_path / "a.safetensors"
    n = 300  # not a multiple of the block: the last block is partial
    layout, keys, values, sha = write_archive(path, rope, n, bits=bits)
    assert 0 < path.stat().st_size - archive_bytes(LAYERS, HEADS, DIM, n, bits=bits, group_size=32, block_tokens=32) < 4096
    archive = Archive.open(path, sha256=sha, expect=layout)
    fmt = KVFormat(bits=bits, group_size=32)
    tokens = torch.tensor([[0, 5, 299], [17, 18, 19], [250, 3, 64]])
    fields = archive.read(1, tokens)
    for kv, data in (("k", keys[1]), ("v", values[1])):
        expected = fmt.encode(torch.gather(data, 1, tokens[..., None].expand(-1, -1, DIM)))
        for name, tensor in expected.items():
            assert torch.equal(fields[f"{kv}.{name}"], tensor), (kv, name)
    # Any safetensors reader sees the same tensors (the header is written by hand).
    with safetensors.safe_open(str(path), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("layer1.k.codes")[:, 1], fmt.encode(keys[1, 1])["codes"])
        assert handle.metadata()["format"] == "halaman-archive-2"
    # Block bounds bracket the keys rotated at their original positions.
    cos, sin = rope.lookup(torch.arange(n))
    rotated = apply_rope(keys[0], cos, sin)
    key_min, key_max = archive.bounds(0)
    for b in range(layout.n_blocks):
        block = rotated[:, b * 32:(b + 1) * 32]
        assert (key_min[b] <= block.amin(1)).all() and (key_max[b] >= block.amax(1)).all()
        assert (block.amin(1) - key_min[b]).max() < 0.01 and (key_max[b] - block.amax(1)).max() < 0.01


def damage(path, offset, tmp_path):
    """A copy of the archive at `path` with the byte at `offset` flipped."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(data))
    return damaged


def test_damaged_truncated_or_foreign_archives_are_refused(tmp_path, rope):
    path = tmp_path / "a.safetensors"
    _, _, _, sha = write_archive(path, rope, 128)
    digests = Archive.open(path)._places["digests.blocks"][0]
    with pytest.raises(ArchiveError, match="digest mismatch"):  # the tables are checked at open
        Archive.open(damage(path, digests + 5, tmp_path), sha256=sha)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ArchiveError, match="bytes"):
        Archive.open(truncated)
    with pytest.raises(ArchiveError, match="another"):
        Archive.open(path, expect=ArchiveLayout(LAYERS, HEADS, DIM, 128, 32, 2, 32))
    with pytest.raises(ArchiveError):
        Archive.open(tmp_path / "missing.safetensors", sha256=sha)
    (tmp_path / "zeros").write_bytes(b"\0" * 64)
    with pytest.raises(ArchiveError):
        Archive.open(tmp_path / "zeros")


def test_opening_hashes_the_header_and_tables_only_and_a_read_checks_each_block_once(tmp_path, rope):
    path = tmp_path / "a.safetensors"
    n = 4096  # 128 blocks: reading one must not hash the others
    layout, _, _, sha = write_archive(path, rope, n, chunk=512)
    archive = Archive.open(path, sha256=sha, expect=layout)
    tables = archive._block_digests.nbytes + archive._bound_digests.nbytes
    assert archive.bytes_hashed < tables + 8192 < path.stat().st_size // 20
    opened = archive.bytes_hashed
    archive.read(1, torch.tensor([[40, 41], [45, 63], [33, 34]]))  # all in block 1 of layer 1
    block_bytes = 32 * HEADS * 2 * KVFormat(bits=4, group_size=32).bytes_per_token(DIM)  # keys and values
    assert archive.bytes_hashed - opened == block_bytes
    archive.read(1, torch.tensor([[40], [41], [42]]))
    assert archive.bytes_hashed - opened == block_bytes, "a block is hashed once per opening"


@pytest.mark.parametrize("what", ["k.codes", "v.scale", "key_max"])
def test_a_damaged_block_is_found_when_it_is_read_not_before(tmp_path, rope, what):
    path = tmp_path / "a.safetensors"
    n = 300
    layout, _, _, sha = write_archive(path, rope, n)
    places = Archive.open(path)._places
    offset, shape, dtype = places[f"layer1.{what}"]
    row = int(torch.tensor(shape[1:]).prod()) * torch.empty((), dtype=dtype).element_size()
    target = 7 if what != "key_max" else 0  # token 7 (block 0) of a field; block 0 of the bounds
    archive = Archive.open(damage(path, offset + target * row + 1, tmp_path), sha256=sha, expect=layout)
    archive.read(0, torch.tensor([[7]] * HEADS))  # the same block of another layer is intact
    archive.read(1, torch.tensor([[200]] * HEADS))  # another block of the damaged layer too
    with pytest.raises(ArchiveError, match="layer 1"):
        if what == "key_max":
            archive.bounds(1)
        else:
            archive.read(1, torch.tensor([[7, 40]] * HEADS))


def test_writer_refuses_out_of_order_chunks_and_an_unfinished_prefill(tmp_path, rope):
    layout = ArchiveLayout(LAYERS, HEADS, DIM, 256, 32, 4, 32)
    writer = ArchiveWriter(tmp_path / "a", layout, rope)
    k = torch.randn(HEADS, 128, DIM)
    with pytest.raises(ArchiveError, match="out of order"):
        writer.append(0, 128, k, k)
    writer.append(0, 0, k, k)
    with pytest.raises(ArchiveError, match="incomplete"):
        writer.finish()
    assert not (tmp_path / "a").exists()


def test_upper_bounds_hold_and_the_top_token_block_is_recalled(tmp_path, rope):
    """Brute force: exact attention logits of the queries over the whole dequantized archive."""
    path = tmp_path / "a.safetensors"
    n = 1024
    layout, keys, _, sha = write_archive(path, rope, n)
    archive = Archive.open(path, sha256=sha)
    gen = torch.Generator().manual_seed(1)
    query = torch.randn((HEADS * GROUP, 4, DIM), generator=gen)  # 4 question tokens, before RoPE
    start = n
    # Plant a key that matches one query strongly (a needle) in each head, at different blocks.
    planted = [100, 517, 990]
    cos_q, sin_q = rope.lookup(torch.arange(start, start + 4))
    q_rot = apply_rope(query, cos_q, sin_q).view(HEADS, GROUP, 4, DIM)
    for h, token in enumerate(planted):
        cos_k, sin_k = rope.lookup(torch.tensor([token]))
        # Pre-RoPE key whose rotation at `token` points along query (h, 0, 2).
        direction = apply_rope(q_rot[h, 0, 2][None], cos_k, -sin_k)[0]
        keys[0, h, token] = direction / direction.norm() * 40
    writer_path = tmp_path / "b.safetensors"
    layout = ArchiveLayout(LAYERS, HEADS, DIM, n, 32, 4, 32)
    writer = ArchiveWriter(writer_path, layout, rope)
    for s in range(0, n, 128):
        for layer in range(LAYERS):
            writer.append(layer, s, keys[layer, :, s:s + 128], keys[layer, :, s:s + 128])
    sha, _ = writer.finish()
    archive = Archive.open(writer_path, sha256=sha)

    fields = archive.read(0, torch.arange(n).expand(HEADS, -1))
    k_hat, _ = archive.decode(fields, torch.float32)
    cos, sin = rope.lookup(torch.arange(n))
    exact = torch.einsum("hgqd,hnd->hgqn", q_rot, apply_rope(k_hat, cos, sin)) * DIM**-0.5
    key_min, key_max = archive.bounds(0)
    bounds = block_upper_bounds(q_rot.reshape(HEADS, -1, DIM), key_min, key_max, DIM**-0.5)  # [H, Q, blocks]
    per_block_max = exact.reshape(HEADS, GROUP * 4, -1, 32).amax(-1)
    assert (bounds >= per_block_max - 1e-3).all(), "Quest bound must bound every key of its block"

    recaller = Recaller(archive, 4 * 32, rope, DIM**-0.5)
    recalled = recaller.recall(0, torch.empty((HEADS, 0), dtype=torch.int32), query, start, torch.float32)
    top = exact.amax(dim=(1, 2)).argmax(dim=-1)  # highest-scoring token per KV head
    assert top.tolist() == planted
    for h in range(HEADS):
        assert int(top[h]) in recalled.index[h][recalled.valid[h]].tolist()
    assert recaller.stats.blocks_scored == HEADS * layout.n_blocks and recaller.stats.tokens_recalled == HEADS * 4 * 32


def test_held_tokens_are_not_recalled_again_and_full_blocks_are_skipped():
    held_index = torch.tensor([[0, 1, 2, 3, 40, 41], [0, 1, 2, 3, 64, 65]], dtype=torch.int32)
    held = held_tokens(held_index, 96)
    assert held.sum().item() == 12 and held[0, 41] and not held[0, 42]
    scores = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    full = held.clone()
    full[1, 32:64] = True  # head 1 holds block 1 entirely: it must not be chosen
    tokens, valid = select_tokens(scores, full, 32, 2)
    assert tokens.shape == (2, 64)
    assert tokens[0].tolist() == list(range(0, 64)) and tokens[1].tolist() == list(range(0, 32)) + list(range(64, 96))
    assert not valid[0, 40] and not valid[0, 0] and valid[0, 42]
    assert not valid[1, 32] and not valid[1, 33] and valid[1, 34]  # tokens 64, 65 held; 66 not


def test_compact_positions_renumber_held_and_recalled_in_document_order():
    held = torch.tensor([[0, 1, 9, 20], [0, 5, 6, 30]], dtype=torch.int32)
    index = torch.tensor([[3, 4, 25, 26], [1, 2, 3, 40]])
    valid = torch.tensor([[True, False, True, True], [True, True, True, False]])
    recalled = RecalledTokens(index=index, valid=valid, keys=torch.zeros(2, 4, DIM), values=torch.zeros(2, 4, DIM), fields={})
    held_pos, rec_pos, offset = compact_order_positions(held, recalled)
    for h in range(2):
        union = sorted(held[h].tolist() + index[h][valid[h]].tolist())
        assert held_pos[h].tolist() == [union.index(t) for t in held[h].tolist()]
        assert rec_pos[h][valid[h]].tolist() == [union.index(t) for t in index[h][valid[h]].tolist()]
        assert int(offset[h]) == len(union)


@pytest.mark.parametrize("compact", [True, False])
def test_attention_with_recalled_tokens_equals_attention_over_the_union(rope, compact):
    """Reference: every held and recalled key in document order, RoPE recomputed at its position
    (compact: its rank; original: its stream position), one softmax."""
    shape = CacheShape(num_layers=1, kv_heads=HEADS, head_dim=DIM, query_heads=HEADS * GROUP)
    policy = CachePolicy(budget_tokens=64, sink_tokens=4, window_tokens=16, residual_tokens=16, kv_bits=16, chunk_tokens=32)
    layer = LayerKV(shape, policy, store_dtype=torch.float16, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    all_k = torch.randn((HEADS, 200, DIM), generator=gen)
    all_v = torch.randn((HEADS, 200, DIM), generator=gen)
    # Feed 200 tokens so that eviction leaves a scattered held set.
    for start in range(0, 160, 32):
        q = torch.randn((HEADS * GROUP, 32, DIM), generator=gen)
        layer.attend(q, all_k[:, start:start + 32], all_v[:, start:start + 32], start=start, rope=rope,
                     scaling=DIM**-0.5, options=StepOptions(compact_positions=compact))
        layer.compress(start + 32, 0)
    held = layer.index.long()
    not_held = [sorted(set(range(160)) - set(held[h].tolist()))[:20] for h in range(HEADS)]
    index = torch.tensor(not_held)
    valid = torch.ones_like(index, dtype=torch.bool)
    valid[:, 3] = False
    recalled = RecalledTokens(index=index, valid=valid, keys=torch.gather(all_k, 1, index[..., None].expand(-1, -1, DIM)),
                              values=torch.gather(all_v, 1, index[..., None].expand(-1, -1, DIM)), fields={})
    layer.set_recalled(recalled, compact_positions=compact)
    stored_k = [layer.sink_k.float(), layer.paged.gather("k.codes").float(), layer.resid_k.float()]
    stored_v = [layer.sink_v.float(), layer.paged.gather("v.codes").float(), layer.resid_v.float()]
    held_k, held_v = torch.cat(stored_k, 1), torch.cat(stored_v, 1)
    query = torch.randn((HEADS * GROUP, 1, DIM), generator=gen)
    new_k, new_v = all_k[:, 160:161], all_v[:, 160:161]
    out = layer.attend(query, new_k, new_v, start=160, rope=rope, scaling=DIM**-0.5,
                       options=StepOptions(compact_positions=compact))
    for h in range(HEADS):
        tokens = held[h].tolist() + index[h][valid[h]].tolist() + [160]
        ks = torch.cat((held_k[h], recalled.keys[h][valid[h]], new_k[h].float()))
        vs = torch.cat((held_v[h], recalled.values[h][valid[h]], new_v[h].float()))
        order = sorted(range(len(tokens)), key=lambda i: tokens[i])
        positions = torch.tensor([order.index(i) if compact else tokens[i] for i in range(len(tokens))])
        cos, sin = rope.lookup(positions)
        ks = apply_rope(ks, cos, sin)
        qpos = torch.tensor([len(tokens) - 1 if compact else 160])
        qcos, qsin = rope.lookup(qpos)
        q = apply_rope(query[h * GROUP:(h + 1) * GROUP, 0], qcos, qsin)
        probs = torch.softmax(q @ ks.T * DIM**-0.5, dim=-1)
        torch.testing.assert_close(out[h * GROUP:(h + 1) * GROUP, 0], probs @ vs, atol=2e-3, rtol=1e-3)
    assert float(recalled.mass[~valid].abs().sum()) == 0 and float(recalled.mass[valid].sum()) > 0


def test_store_counts_archives_in_the_budget_and_drops_them_with_their_entry(tmp_path):
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=10_000)
    key_a, key_b = "a" * 64, "b" * 64
    store.put(key_a, {"x": torch.zeros(100, dtype=torch.uint8)}, {}, n_tokens=1, label="A")
    temp = store.archive_temp_path(key_a)
    temp.write_bytes(b"\1" * 4000)
    final = store.put_archive(key_a, temp, sha256="0" * 64, size_bytes=4000)
    assert final.is_file() and not temp.exists()
    assert store.archive(key_a) == (final, "0" * 64)
    assert store.entries()[0].archive_bytes == 4000
    assert store.total_bytes() == store.entries()[0].size_bytes + 4000
    # A second entry + archive over the budget evicts the first entry and its archive.
    store.put(key_b, {"x": torch.zeros(100, dtype=torch.uint8)}, {}, n_tokens=1, label="B")
    temp = store.archive_temp_path(key_b)
    temp.write_bytes(b"\2" * 6000)
    store.put_archive(key_b, temp, sha256="1" * 64, size_bytes=6000)
    assert [e.key for e in store.entries()] == [key_b] and not final.exists() and store.archive(key_a) is None
    # Orphan archive files (no entry) are cleaned when the store opens; clear removes everything.
    (tmp_path / "p" / f"{'c' * 64}.archive.safetensors").write_bytes(b"x")
    store.close()
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=10_000)
    assert not (tmp_path / "p" / f"{'c' * 64}.archive.safetensors").exists()
    store.clear()
    assert store.total_bytes() == 0 and not list((tmp_path / "p").glob("*.archive.safetensors"))


def test_recall_settings_validate_and_round_trip(tmp_path):
    settings = EngineSettings(recall=RecallSettings(archive_bits=2, recall_tokens=256, block_tokens=64))
    path = save_settings(settings, tmp_path / "s.toml")
    assert load_settings(path).recall == settings.recall
    with pytest.raises(SettingsError, match="archive_bits"):
        RecallSettings(archive_bits=3).validate()
    with pytest.raises(SettingsError, match="divide"):
        EngineSettings(cache=CachePolicy(chunk_tokens=500)).validate()


@pytest.mark.parametrize("packing", ["bf16-int8", "int8"])
def test_a_decode_step_reads_recalled_tokens_from_the_int8_workspace_as_from_the_tensors(rope, packing):
    """On a CPU with int4 weights the decode workspace holds the recalled tokens packed too
    (bfloat16 keys and int8 values with AVX-512 BF16, int8 keys and values without): the step's
    output is the float32 one's within the roundings' few per mille, and the same workspace
    serves the next step."""
    from engine.kvcache.cache import packed_workspace

    attention_dtype, int8_steps = (torch.bfloat16, False) if packing == "bf16-int8" else (None, True)
    packed = packed_workspace(attention_dtype, torch.device("cpu"), int8_steps)
    if packed is None:
        pytest.skip("this CPU has no bfloat16 prefill path, so decoding keeps float32")
    shape = CacheShape(num_layers=1, kv_heads=HEADS, head_dim=DIM, query_heads=HEADS * GROUP)
    policy = CachePolicy(budget_tokens=64, sink_tokens=4, window_tokens=16, residual_tokens=16, kv_bits=4, chunk_tokens=32)
    layer = LayerKV(shape, policy, store_dtype=torch.float16, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    all_k, all_v = torch.randn((HEADS, 400, DIM), generator=gen), torch.randn((HEADS, 400, DIM), generator=gen)
    for start in range(0, 128, 32):
        layer.attend(torch.randn((HEADS * GROUP, 32, DIM), generator=gen), all_k[:, start:start + 32],
                     all_v[:, start:start + 32], start=start, rope=rope, scaling=DIM**-0.5, options=StepOptions())
        layer.compress(start + 32, 0)
    index = torch.arange(128, 400).expand(HEADS, -1).contiguous()  # a span read again, in focus
    recalled = RecalledTokens(index=index, valid=torch.ones_like(index, dtype=torch.bool), keys=all_k[:, 128:400],
                              values=all_v[:, 128:400], fields={}, focus_from=400)
    layer.set_recalled(recalled, compact_positions=False)
    for step in range(2):
        query = torch.randn((HEADS * GROUP, 1, DIM), generator=gen)
        new_k, new_v = torch.randn((HEADS, 1, DIM), generator=gen), torch.randn((HEADS, 1, DIM), generator=gen)
        options = StepOptions(pending=True, attention_dtype=attention_dtype, int8_steps=int8_steps)
        kwargs = dict(start=400 + step, rope=rope, scaling=DIM**-0.5)
        plain = layer.attend(query, new_k, new_v, options=options, **kwargs)
        layer._pending = None
        held = layer.attend(query, new_k, new_v, options=replace(options, reuse_workspace=True), **kwargs)
        assert type(layer._workspace.recall.keys) is packed and layer._workspace.recall.keys is layer._workspace.recall.values
        error = float((held - plain).norm() / plain.norm())
        assert 1e-5 < error < 1.5e-2, error  # really rounded, but only by a few per mille
        layer.commit_pending(1)
    assert layer.workspace_bytes() >= layer._workspace.recall.keys.nbytes > 0
