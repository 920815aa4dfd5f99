"""A question forks the document snapshot (`CompressedCache.fork`): the fork shares the snapshot's
tensors, copies a pool's storage only when it first writes to it, and never changes the snapshot."""

import pytest
import torch

from engine.kvcache.blocks import PagedTokens
from engine.settings import CachePolicy

PROMPT = (
    "The KV cache stores the keys and values of every token a transformer has seen, so decoding the "
    "next token costs one pass instead of a pass over the whole prompt. Long documents make it large: "
    "it grows linearly with the number of tokens, the number of layers and the number of KV heads. "
)


def raw_bytes(cache) -> dict[str, torch.Tensor]:
    """Every tensor of every layer (the whole pool storage included) as a copy of its bytes: unused
    block slots hold garbage, possibly NaN, which a float comparison would call unequal."""
    return {f"layer{i}.{name}": t.contiguous().view(-1).view(torch.uint8).clone()
            for i, layer in enumerate(cache.layers) for name, t in layer.tensors().items()}


def test_a_forked_pool_shares_its_blocks_until_a_write_then_copies_them():
    specs = {"codes": ((2,), torch.uint8)}
    base = PagedTokens(specs, kv_heads=2, block_tokens=4, max_tokens=64, device=torch.device("cpu"))
    base.append({"codes": torch.arange(2 * 6 * 2, dtype=torch.uint8).reshape(2, 6, 2)})
    fork = base.fork()
    assert fork.pool.storage["codes"] is base.pool.storage["codes"]  # nothing copied yet
    held = base.gather("codes").clone()
    fork.append({"codes": torch.full((2, 2, 2), 200, dtype=torch.uint8)})  # into the last, shared block
    fork.keep(torch.tensor([[0, 2, 6, 7], [1, 3, 5, 6]]))
    fork.append({"codes": torch.full((2, 5, 2), 201, dtype=torch.uint8)})  # the pool grows
    assert torch.equal(base.gather("codes"), held) and base.n_tokens == 6
    assert torch.equal(fork.gather("codes")[0, :4, 0], torch.tensor([0, 4, 200, 200], dtype=torch.uint8))
    base.append({"codes": torch.full((2, 1, 2), 7, dtype=torch.uint8)})  # the original writes: the fork keeps its own
    assert fork.gather("codes").shape == (2, 9, 2) and int(fork.gather("codes")[:, 4:].min()) == 201


@pytest.mark.parametrize("mode", ["original", "compact"])
def test_questions_on_forks_leave_the_snapshot_bit_identical_and_agree(smol, mode):
    """A question and 40 decode steps (flushes, evictions, the decode workspace) on each of two
    forks: the snapshot's every byte is as before, and both forks give the same logits, bit for bit."""
    decoder = smol.decoder
    ids = torch.tensor(smol.tokenizer(PROMPT * 8, add_special_tokens=False)["input_ids"][:260])
    assert ids.shape == (260,)
    policy = CachePolicy(budget_tokens=96, window_tokens=32, residual_tokens=16, kv_bits=4, chunk_tokens=64, block_tokens=16)
    snapshot = decoder.new_cache(policy, mode)
    decoder.prefill(ids[:200], snapshot)
    snapshot.shrink()
    before, seen = raw_bytes(snapshot), snapshot.seen_tokens
    forks, runs = [], []
    for _ in range(2):
        fork = snapshot.fork()
        logits = [decoder.prefill(ids[200:220], fork)]
        logits += [decoder.forward(ids[t : t + 1], fork, slack_tokens=8, reuse_workspace=True) for t in range(220, 260)]
        assert fork.layers[3].n_tokens <= policy.budget_tokens + 8 and fork.workspace_bytes() > 0
        forks.append(fork)
        runs.append(torch.cat(logits))
        after = raw_bytes(snapshot)
        assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)
        assert snapshot.seen_tokens == seen and snapshot.workspace_bytes() == 0
    assert torch.equal(runs[0], runs[1])
    # the second fork's writes did not reach the first either
    steps = [decoder.forward(torch.tensor([42]), fork, slack_tokens=8, reuse_workspace=True) for fork in forks]
    assert torch.equal(steps[0], steps[1])
