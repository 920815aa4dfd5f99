"""`engine.kvcache.positions` against a per-token brute force: where each held, recalled and new
token sits, in the three position modes, without a model."""

import pytest
import torch

from engine.kvcache.positions import PositionKind, attention_positions
from engine.kvcache.recall import RecalledTokens

HEADS, STABLE, RESIDUAL, CHUNK, DOCUMENT = 3, 40, 6, 4, 300


def held_index(gen: torch.Generator, document_tokens: list[int], start: int) -> torch.Tensor:
    """`[HEADS, STABLE + RESIDUAL]` int32 stream positions as eviction leaves them (ascending per
    head): head h holds `document_tokens[h]` document tokens (below `DOCUMENT`), then tokens of the
    question and answer, the last `RESIDUAL` being the newest (the residual, the same in every head)."""
    rows = []
    for count in document_tokens:
        document = torch.randperm(DOCUMENT, generator=gen)[:count]
        later = DOCUMENT + torch.randperm(start - RESIDUAL - DOCUMENT, generator=gen)[: STABLE - count]
        rows.append(torch.cat((document.sort().values, later.sort().values, torch.arange(start - RESIDUAL, start))))
    return torch.stack(rows).to(torch.int32)


def recalled_tokens(gen: torch.Generator, index: torch.Tensor, focus_from: int | None = None) -> RecalledTokens:
    """12 archived document tokens per head, two of them already held (invalid, masked)."""
    rows, valid = [], []
    for h in range(HEADS):
        held = index[h].long()
        unheld = torch.tensor([p for p in range(DOCUMENT) if p not in set(held.tolist())])
        chosen = torch.cat((unheld[torch.randperm(len(unheld), generator=gen)[:10]], held[:2])).sort().values
        rows.append(chosen)
        valid.append(~torch.isin(chosen, index[h].long()))
    index_r = torch.stack(rows).to(torch.int32)
    empty = torch.zeros((HEADS, 12, 8))
    return RecalledTokens(index=index_r, valid=torch.stack(valid), keys=empty, values=empty, fields={}, focus_from=focus_from)


def brute_force(index, start, recalled, compact):
    """Per head and token, in plain Python: positions of the stable tokens, the tail (residual +
    chunk), the recalled tokens, and (focus) which tokens are attended and how many leading stable
    slots every head hides."""
    stream = [index[h].tolist() + list(range(start, start + CHUNK)) for h in range(HEADS)]
    recalled_index = recalled.index.tolist() if recalled is not None else None
    hidden, visible = 0, None
    if recalled is not None and recalled.focus_from is not None:
        r, focus = recalled.index.shape[1], recalled.focus_from
        positions = [[max(0, r + p - focus) for p in row] for row in stream]
        visible = [[p >= focus for p in row] for row in stream]
        leading = [next(s for s in range(STABLE + 1) if s == STABLE or row[s]) for row in visible]
        hidden = min(leading)
        recalled_positions = [list(range(r))] * HEADS
    elif compact and recalled is None:
        positions = [list(range(len(row))) for row in stream]
        recalled_positions = None
    elif compact:  # held and valid recalled tokens ranked together by stream position
        positions, recalled_positions = [], []
        for h, row in enumerate(stream):
            valid = [j for j in range(len(recalled_index[h])) if recalled.valid[h, j]]
            ranked = sorted([(p, "held", s) for s, p in enumerate(row)] + [(recalled_index[h][j], "recalled", j) for j in valid])
            held_pos, rec_pos = [0] * len(row), [0] * len(recalled_index[h])
            for rank, (_, kind, slot) in enumerate(ranked):
                (held_pos if kind == "held" else rec_pos)[slot] = rank
            positions.append(held_pos)
            recalled_positions.append(rec_pos)
    else:
        positions, recalled_positions = stream, recalled_index
    return positions, recalled_positions, visible, hidden


def check(index, start, recalled, compact):
    got = attention_positions(index, STABLE, start=start, chunk=CHUNK, recalled=recalled, compact=compact)
    positions, recalled_positions, visible, hidden = brute_force(index, start, recalled, compact)
    assert got.hidden == hidden
    stable = got.stable if got.stable is not None else torch.arange(STABLE).expand(HEADS, -1)
    attended = torch.cat((stable, got.tail.expand(HEADS, -1)), dim=1).long()
    assert attended.tolist() == [row[hidden:] for row in positions]
    assert got.query.expand(HEADS, -1).tolist() == [row[-CHUNK:] for row in positions]
    if recalled is None:
        assert got.recalled is None
    else:
        assert got.recalled.long().tolist() == recalled_positions
    if visible is None:
        assert got.stable_mask is None and got.tail_mask is None
    else:
        assert torch.cat((got.stable_mask, got.tail_mask), dim=1).tolist() == [row[hidden:] for row in visible]
    if got.bound is not None:
        assert got.bound > attended.max()
    return got


@pytest.mark.parametrize("seed", range(5))
def test_original_positions_are_stream_positions(seed):
    gen = torch.Generator().manual_seed(seed)
    index = held_index(gen, [10, 14, 20], start=500)
    assert check(index, 500, None, compact=False).kind is PositionKind.INDEX
    assert check(index, 500, recalled_tokens(gen, index), compact=False).kind is PositionKind.INDEX


@pytest.mark.parametrize("seed", range(5))
def test_compact_positions_follow_the_slots_without_recall(seed):
    gen = torch.Generator().manual_seed(seed)
    got = check(held_index(gen, [10, 14, 20], start=500), 500, None, compact=True)
    assert got.kind is PositionKind.SLOTS and got.stable is None


@pytest.mark.parametrize("seed", range(5))
def test_compact_positions_rank_held_and_recalled_tokens_in_document_order(seed):
    gen = torch.Generator().manual_seed(seed)
    index = held_index(gen, [10, 14, 20], start=500)
    recalled = recalled_tokens(gen, index)
    assert recalled.valid.sum(dim=1).tolist() == [10] * HEADS  # held ones take no position
    got = check(index, 500, recalled, compact=True)
    assert got.kind is None and got.order is not None
    again = attention_positions(index, STABLE, start=500, chunk=CHUNK, recalled=recalled, compact=True, order=got.order)
    assert torch.equal(again.tail, got.tail) and torch.equal(again.stable, got.stable)


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_focus_numbers_the_recalled_tokens_first_and_hides_the_held_document(seed, compact):
    gen = torch.Generator().manual_seed(seed)
    index = held_index(gen, [10, 14, 20], start=500)
    got = check(index, 500, recalled_tokens(gen, index, focus_from=DOCUMENT), compact=compact)
    assert got.hidden == 10 and got.kind is None and got.stable_mask.sum(dim=1).tolist() == [30, 26, 20]
