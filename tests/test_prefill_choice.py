"""How a CPU computes a prefill chunk (`prefill_choice`): the way measured fastest computes every
chunk, the first included; it is measured once per process and model shape; a near tie goes to the
way that rounds least; and the float32 row blocks agree with a float64 brute force."""

import time

import pytest
import torch

from engine.kvcache import attention, prefill_choice
from engine.kvcache.attention import chunk_attention
from engine.kvcache.row_blocks import row_block_attention


def random_chunk(seed, held=300, chunk=100, kv_heads=3, group=3, d=64):
    torch.manual_seed(seed)
    query = torch.randn(kv_heads, group, chunk, d) * 2
    keys = (torch.randn(kv_heads, held, d) * 2, torch.randn(kv_heads, chunk, d) * 2)
    values = (torch.randn(kv_heads, held, d), torch.randn(kv_heads, chunk, d))
    return query, keys, values


def chunk(seed=0, **shape):
    query, keys, values = random_chunk(seed, **shape)
    return chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)


def slowed(function, seconds):
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return function(*args, **kwargs)
    return slow


@pytest.fixture
def fresh(monkeypatch):
    """Measure again in this test, and forget what it measured afterwards."""
    monkeypatch.setattr(prefill_choice, "METHOD", "auto")
    prefill_choice.forget_choices()
    yield
    prefill_choice.forget_choices()


def forced(monkeypatch, way, seed=0):
    with monkeypatch.context() as m:
        m.setattr(prefill_choice, "METHOD", way)
        return chunk(seed)


def test_the_fastest_way_computes_every_chunk(fresh, monkeypatch):
    """Whichever way is made the fastest (the others slowed by a sleep) is chosen, and the first
    chunk of the process already equals that way's result, output and scores."""
    results = {way: forced(monkeypatch, way) for way in ("float32", "flash", "blocked")}
    for a, b in (("float32", "flash"), ("flash", "blocked")):  # else the checks could not tell them apart
        assert not torch.equal(results[a][1], results[b][1])
    real = {"float32": attention._float32_way, "fused": attention._fused_attention}
    for fastest in ("blocked", "flash", "float32"):
        prefill_choice.forget_choices()
        monkeypatch.setattr(attention, "_float32_way", real["float32"] if fastest == "float32" else slowed(real["float32"], 0.2))

        def fused(*args, sums, fastest=fastest, **kwargs):
            if sums != fastest:
                time.sleep(0.2)
            return real["fused"](*args, sums=sums, **kwargs)
        monkeypatch.setattr(attention, "_fused_attention", fused)
        output, scores = chunk()
        [choice] = prefill_choice.measured()
        assert choice.way == fastest and set(choice.ms) == {"float32", "flash", "blocked"}
        assert torch.equal(output, results[fastest][0]) and torch.equal(scores, results[fastest][1])


def test_a_near_tie_goes_to_the_way_that_rounds_least(fresh):
    zeros = lambda query, *rest: (query, torch.zeros(1))  # noqa: E731
    ways = {"blocked": slowed(zeros, 0.1), "flash": slowed(zeros, 0.104), "float32": slowed(zeros, 0.104)}
    assert prefill_choice.way_for(3, 3, 64, ways) == "float32"
    prefill_choice.forget_choices()
    ways["float32"] = slowed(zeros, 0.3)  # now clearly slower: the flash sums, within 10 % of the fastest
    assert prefill_choice.way_for(3, 3, 64, ways) == "flash"


def test_measured_once_per_process_and_shape(fresh, monkeypatch):
    calls = []
    real = prefill_choice._measure
    monkeypatch.setattr(prefill_choice, "_measure", lambda *shape: calls.append(shape[:3]) or real(*shape))
    chunk(0)
    chunk(1)
    assert calls == [(3, 3, 64)]
    chunk(2, kv_heads=2, group=6)  # another model's shape: measured for it
    assert calls == [(3, 3, 64), (2, 6, 64)] and len(prefill_choice.measured()) == 2


def test_without_bfloat16_attention_float32_is_the_only_way(fresh):
    query, keys, values = random_chunk(3)
    output, scores = chunk_attention(query, keys, values, scaling=0.125, masks=(None, None))
    expected = row_block_attention(query, keys, values, scaling=0.125, keep=None)
    assert torch.equal(output, expected[0]) and torch.equal(scores, expected[1])
    assert prefill_choice.measured() == []  # nothing to choose from, nothing timed


def test_a_way_the_cpu_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(prefill_choice, "METHOD", "fast")
    with pytest.raises(ValueError, match="'auto' or one of"):
        chunk()
    monkeypatch.setattr(prefill_choice, "METHOD", "flash")  # the fused path needs bfloat16 attention
    query, keys, values = random_chunk(4)
    with pytest.raises(ValueError, match="'auto' or one of"):
        chunk_attention(query, keys, values, scaling=0.125, masks=(None, None))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("rows", [None, 7])  # the real block size, and blocks that cut query heads apart
def test_row_blocks_match_float64_brute_force(masked, rows, monkeypatch):
    """Output and H2O scores against softmax in float64, with a sink-like key whose logits are large,
    hidden keys (a recalled set's duplicates) and the chunk's causal mask."""
    from engine.kvcache import row_blocks

    if rows:
        monkeypatch.setattr(row_blocks, "ROWS", rows)
    query, keys, values = random_chunk(5, held=150, chunk=60, kv_heads=2, group=3, d=32)
    keys[0][:, 0] *= 5
    keep = None
    if masked:
        keep = torch.rand(2, 210) > 0.3
        keep[:, 150:] = True
    output, scores = row_block_attention(query, keys, values, scaling=32**-0.5, keep=keep)
    k, v = torch.cat(keys, 1).double(), torch.cat(values, 1).double()
    logits = torch.einsum("hgid,hjd->hgij", query.double() * 32**-0.5, k)
    hide = torch.zeros(2, 60, 210, dtype=torch.bool)
    hide[:, :, 150:] = torch.ones(60, 60, dtype=torch.bool).triu(1)
    if masked:
        hide |= ~keep[:, None, :]
    probs = logits.masked_fill(hide[:, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(output.double(), torch.einsum("hgij,hjd->hgid", probs, v), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.double(), probs.sum(dim=(1, 2)), rtol=1e-5, atol=1e-5)
    if masked:
        assert float(scores[~keep].abs().max()) == 0.0
