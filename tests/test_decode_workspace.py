"""The CPU decode workspace (`engine.kvcache.decode_workspace`): its int8 values and bfloat16 or int8
keys against a float64 brute force, and appended / compacted workspaces against ones built at once."""

import pytest
import torch

from engine.kvcache import key_layout
from engine.kvcache.attention import chunk_attention
from engine.kvcache.decode_workspace import Bf16Int8Workspace, DenseWorkspace, Int8Workspace, int8_rows
from test_kvcache_attention import reference


@pytest.fixture(params=["rows", "transposed"])
def layout(request, monkeypatch):
    """The two ways a `Bf16Int8Workspace` may hold its keys (`engine.kvcache.key_layout`)."""
    monkeypatch.setattr(key_layout, "METHOD", request.param)
    return request.param


def test_int8_rows_round_each_row_to_a_127th_of_its_largest_magnitude():
    x = torch.randn(3, 50, 64) * torch.rand(3, 50, 1) * 10
    codes, scale = int8_rows(x)
    assert codes.dtype == torch.int8 and scale.shape == (3, 50)
    assert int(codes.abs().amax(dim=-1).min()) == 127  # every row uses its whole range
    assert bool(((codes.float() * scale[..., None] - x).abs() <= scale[..., None] / 2 + 1e-6).all())


@pytest.mark.parametrize("kind", [Bf16Int8Workspace, Int8Workspace])
@pytest.mark.parametrize("chunk", [1, 4, 30])  # a decode step, a few drafts, a chunk long enough to join the keys
def test_int8_workspace_attention_matches_brute_force(chunk, kind, layout):
    """A decode step over the workspace (bfloat16 or int8 keys, int8 values) plus a float32 tail:
    output within the roundings' few per mille of the float64 reference, H2O scores within 2 % (the
    logits are rounded to bfloat16: ~1 % here, with logits larger than the model's)."""
    torch.manual_seed(0)
    kv_heads, group, d = 3, 3, 64
    held, tail = torch.randn(kv_heads, 700, d) * 2, torch.randn(kv_heads, 40 + chunk, d) * 2
    held[:, 0] *= 4  # a sink-like key with large logits
    held_v, tail_v = torch.randn(kv_heads, 700, d), torch.randn(kv_heads, 40 + chunk, d)
    query = torch.randn(kv_heads, group, chunk, d) * 2
    workspace = kind(held, held_v, group)
    if kind is Bf16Int8Workspace:
        assert workspace._transposed == (layout == "transposed")
    out, scores = chunk_attention(query, (workspace, tail), (workspace, tail_v), scaling=d**-0.5, masks=(None, None))
    ref_out, ref_scores = reference(query, (held, tail), (held_v, tail_v), d**-0.5, (None, None))
    assert out.dtype == torch.float32 and out.shape == ref_out.shape
    error = float((out.double() - ref_out).norm() / ref_out.norm())
    # really rounded, but only by a few per mille; int8 keys add up to half a 127th of each key's
    # largest magnitude to its logits (1.9 % here, where the logits are larger than the model's; on
    # the model its decode steps' KL against float32 matched the bfloat16 keys', docs/BENCHMARKS.md §2e)
    assert 1e-4 < error < (1.5e-2 if kind is Bf16Int8Workspace else 2.5e-2)
    assert float((scores.double() - ref_scores).abs().sum() / ref_scores.sum()) < 2e-2
    torch.testing.assert_close(scores.sum(dim=1).double(), torch.full((kv_heads,), float(group * chunk), dtype=torch.float64), rtol=1e-5, atol=0)
    # bfloat16 or int8 keys (with a float32 scale), int8 values padded to 704 tokens (the kernel's
    # blocks of 16), float32 scales
    keys = 700 * d * 2 if kind is Bf16Int8Workspace else 700 * (d + 4)
    assert workspace.nbytes == kv_heads * (keys + 704 * d + 700 * 4)


@pytest.mark.parametrize("kind", [DenseWorkspace, Bf16Int8Workspace, Int8Workspace])
def test_a_workspace_appended_to_and_compacted_holds_what_one_built_at_once_holds(kind, layout):
    """Flushes append, evictions keep slots (with or without new keys): the parts attended equal,
    bit for bit, those of a workspace built from the surviving tokens in one go."""
    torch.manual_seed(1)
    keys, values = torch.randn(2, 300, 64), torch.randn(2, 300, 64)
    make = (lambda k, v: kind(k, v, room=16)) if kind is DenseWorkspace else kind
    grown = make(keys[:, :200], values[:, :200])
    grown.append(keys[:, 200:232], values[:, 200:232])  # past the dense one's room: it grows
    grown.append(keys[:, 232:300], values[:, 232:300])
    slots = torch.sort(torch.randperm(300)[:180]).values.expand(2, -1).contiguous()
    slots[1] = torch.sort(torch.randperm(300)[:180]).values  # heads keep different tokens
    kept_k = torch.gather(keys, 1, slots[..., None].expand(-1, -1, 64))
    kept_v = torch.gather(values, 1, slots[..., None].expand(-1, -1, 64))
    grown.keep(slots)
    query = torch.randn(2, 2, 1, 64)
    once = make(kept_k, kept_v)
    assert grown.n == once.n == 180
    assert all(torch.equal(a, b) for a, b in zip(attend(query, grown), attend(query, once), strict=True))
    rotated = torch.randn(2, 180, 64)  # compact positions: the kept tokens' keys rotated anew
    grown.keep(torch.arange(180).expand(2, -1), rotated)
    assert all(torch.equal(a, b) for a, b in zip(attend(query, grown), attend(query, make(rotated, kept_v)), strict=True))
    if kind is Bf16Int8Workspace:  # in either layout the held keys read back as the rotated ones, rounded
        assert torch.equal(grown.dense()[0], rotated.to(torch.bfloat16).float())


def attend(query, workspace):
    keys, values = workspace.attention_parts()
    tail = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    return chunk_attention(query, (keys, tail), (values, tail), scaling=0.125, masks=(None, None))
