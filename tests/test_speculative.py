"""Prompt-lookup speculative decoding: drafts, rollback of rejected tokens, and greedy equality."""

import pytest
import torch

from engine.prompt_lookup import PromptLookup
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings

SLACK = 32
POLICY = CachePolicy(budget_tokens=160, window_tokens=64, residual_tokens=32, chunk_tokens=64)
TEXT = (
    "The KV cache stores the keys and values of every token a transformer has seen, so decoding the "
    "next token costs one pass instead of a pass over the whole prompt. Long documents make it large: "
    "it grows linearly with the number of tokens, the number of layers and the number of KV heads. "
)


def test_lookup_drafts_what_followed_the_last_ngram():
    lookup = PromptLookup([5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4])
    lookup.reset([100, 6, 7])
    assert lookup.propose(3) == [3, 4]  # latest occurrence of (6, 7) in the document, cut at its end
    lookup.reset([5, 6])
    assert lookup.propose(2) == [7, 8]
    lookup.extend([7, 8, 42, 5, 6])  # the answer repeats itself: its own continuation comes first
    assert lookup.propose(3) == [7, 8, 42]
    lookup.reset([77, 88])
    assert lookup.propose(4) == [] and lookup.propose(0) == []


def layer_state(layer):
    state = {name: t.clone() for name, t in layer.export().items()}  # used blocks only (free ones hold garbage)
    state["paged_tokens"] = torch.tensor(layer.paged.n_tokens)
    return state


def assert_same_cache(a, b):
    assert a.seen_tokens == b.seen_tokens
    for la, lb in zip(a.layers, b.layers, strict=True):
        sa, sb = layer_state(la), layer_state(lb)
        assert sa.keys() == sb.keys()
        for name in sa:
            if name in ("index", "block_table", "paged_tokens") or not sa[name].is_floating_point():
                assert torch.equal(sa[name], sb[name]), name
            else:
                # A token computed in a batch of 6 rather than alone differs in the last float32 bits,
                # which 30 layers grow to ~2e-3 in a stored key (batching noise, as in any chunked
                # prefill); unused block slots hold garbage. A leaked draft would show in the counts
                # and index (exact) and in the total attention mass (below).
                torch.testing.assert_close(sa[name].float(), sb[name].float(), rtol=1e-2, atol=1e-2, equal_nan=True)
        # each fed query hands out exactly `group` units of attention per KV head: a rejected draft
        # committed by mistake would add 3 here
        torch.testing.assert_close(la.score.sum(1), lb.score.sum(1), rtol=1e-5, atol=1e-3)


@pytest.fixture(scope="module")
def filled(smol):
    ids = torch.tensor(smol.tokenizer(TEXT * 2, add_special_tokens=False)["input_ids"])
    cache = smol.decoder.new_cache(POLICY, "original")
    smol.decoder.prefill(ids, cache)
    return cache


@pytest.mark.parametrize("accepted", [0, 2, 5])
def test_rejected_drafts_leave_the_cache_as_if_never_fed(smol, filled, accepted):
    decoder = smol.decoder
    fed = [11, 12, 13, 14, 15, 16]  # the token, then 5 drafts
    room = filled.tokens_until_compress(SLACK)
    assert room >= len(fed)
    spec = filled.fork()
    logits = decoder.forward(torch.tensor(fed), spec, all_logits=True, pending=True, reuse_workspace=True)
    spec.commit(1 + accepted, SLACK)
    plain = filled.fork()
    plain_logits = [decoder.forward(torch.tensor([t]), plain, slack_tokens=SLACK, reuse_workspace=True)[0] for t in fed[: 1 + accepted]]
    assert_same_cache(spec, plain)
    # logits agree to batching noise (~1e-2 on logits of magnitude ~20) and pick the same tokens
    plain_logits = torch.stack(plain_logits)
    torch.testing.assert_close(logits[: 1 + accepted], plain_logits, rtol=1e-3, atol=5e-2)
    assert torch.equal(logits[: 1 + accepted].argmax(-1), plain_logits.argmax(-1))
    # and the next step continues alike
    nxt_spec = decoder.forward(torch.tensor([99]), spec, slack_tokens=SLACK)
    nxt_plain = decoder.forward(torch.tensor([99]), plain, slack_tokens=SLACK)
    torch.testing.assert_close(nxt_spec, nxt_plain, rtol=1e-3, atol=5e-2)


def test_a_pass_that_ends_on_a_flush_or_eviction_compresses_like_one_token_decoding(smol, filled):
    decoder = smol.decoder
    spec, plain = filled.fork(), filled.fork()
    while (room := plain.tokens_until_compress(SLACK)) > 3:  # walk up to a compress boundary
        for c in (spec, plain):
            decoder.forward(torch.tensor([21]), c, slack_tokens=SLACK)
    held_before = plain.layers[0].paged.n_tokens + plain.layers[0].resid_k.shape[1]
    fed = list(range(30, 30 + room))
    decoder.forward(torch.tensor(fed), spec, all_logits=True, pending=True)
    spec.commit(room, SLACK)
    for t in fed:
        decoder.forward(torch.tensor([t]), plain, slack_tokens=SLACK)
    assert_same_cache(spec, plain)
    layer = plain.layers[0]
    # the boundary really was crossed: a flush moved the residual into blocks, or tokens were evicted
    assert layer.resid_k.shape[1] <= POLICY.residual_tokens or layer.n_tokens < held_before + room


def test_answers_with_drafts_equal_greedy_decoding_token_for_token(smol, tmp_path):
    doc = tmp_path / "primer.txt"
    doc.write_text(TEXT * 4 + "The pass phrase is: blue heron over the quiet harbour at dawn.\n")
    questions = ["Quote the first sentence of the document.", "What is the pass phrase?", "What grows linearly?"]
    answers = {}
    for drafts in (0, 8):
        session = DocumentSession(smol, EngineSettings(max_new_tokens=40, prefix_cache=False, draft_tokens=drafts))
        session.open(str(doc))
        answers[drafts] = [session.ask(q) for q in questions]
    for plain, spec in zip(answers[0], answers[8], strict=True):
        assert spec.token_ids == plain.token_ids
        assert plain.drafts.passes == 0
    assert sum(a.drafts.accepted for a in answers[8]) > 0  # drafting really ran and saved passes
