"""The few-operator decode step (`engine.kvcache.step.attend_step`) over layers that hold recalled
tokens, against the general path (`LayerKV.attend`, `CompressedDecoder.fast_steps = False`), on the
embedded model with int4 weights as the app loads them on a CPU.

An answer holds its question's recalled set from the question to its last token, so before this
every real answer's steps took the general path. Checked: 64 greedy steps after a question that
recalled spans (focus, the app's default; and without focus, whose masks hide the recalled tokens
a layer already holds; each in both position modes), over a document past the budget so that the
steps flush and evict, for each form of the decode workspace: logits and the attention the recalled tokens
received equal bit for bit, and the fast step ran. And a question asked through `DocumentSession`
(span recall from the archive, drafts off): the same answer token ids, with the fast step taken."""

import pytest
import torch

import engine.models.decode_step as decode_step_module
from engine.documents import Document, Segment
from engine.kvcache.cache import LayerKV
from engine.kvcache.span_recall import SpanCapture, SpanRecaller
from engine.models.decoder import ChunkTaps
from engine.prefix_store import PrefixStore
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings, RecallSettings
from test_decode_step import document_ids, int4, steps_around_a_draft  # noqa: F401  (fixtures)

STEPS = 64
SLACK = 8  # evict every few steps (the app's is 1/32 of the budget: `decode_eviction_slack`)
# A window shorter than question + answer: the question's tokens are evicted too, differently per KV head,
# so that under focus some heads hold document tokens past the hidden ones (masked, not hidden).
POLICY = CachePolicy(budget_tokens=384, window_tokens=40, residual_tokens=32, chunk_tokens=128)
QUESTION = "\nQuestion: what does the law say about circumvention?\nAnswer:"
WORKSPACES = {  # the decode workspace's form -> (attention_dtype, int8_steps) that choose it (`packed_workspace`)
    "Bf16Int8Workspace": (torch.bfloat16, False),
    "Int8Workspace": (torch.bfloat16, True),
    "DenseWorkspace": (torch.float32, False),
}


def counting_attend():
    """Patch `LayerKV.attend` to count its calls; returns (counts, undo)."""
    calls, saved = {"attend": 0}, LayerKV.attend

    def counted(self, *args, **kwargs):
        calls["attend"] += 1
        return saved(self, *args, **kwargs)

    LayerKV.attend = counted
    return calls, lambda: setattr(LayerKV, "attend", saved)


def answer_steps(decoder, snapshot, question_ids, recaller, fast: bool):
    """The question (recalling with `recaller`) on a fork of `snapshot`, then 64 greedy steps: their
    logits, the recalled tokens' attention mass per layer, and the general path's layer calls."""
    fork = snapshot.fork()
    logits = [decoder.forward(question_ids, fork, taps=ChunkTaps(recaller=recaller))]
    assert all(layer.recalled is not None for layer in fork.layers)
    decoder.fast_steps = fast
    calls, undo = counting_attend()
    try:
        for _ in range(STEPS):
            token = int(logits[-1][-1].argmax())
            logits.append(decoder.forward(torch.tensor([token]), fork, slack_tokens=SLACK, reuse_workspace=True))
    finally:
        decoder.fast_steps = True
        undo()
    return torch.cat(logits), [layer.recalled.mass.clone() for layer in fork.layers], calls["attend"], fork


@pytest.mark.parametrize("workspace", list(WORKSPACES))
@pytest.mark.parametrize(("mode", "focus"), [("original", True), ("compact", True), ("original", False),
                                             ("compact", False)])
def test_fast_steps_over_recalled_tokens_give_the_general_paths_logits(int4, document_ids, mode, focus, workspace):
    decoder = int4.decoder
    saved = decoder.attention_dtype, decoder.int8_steps
    decoder.attention_dtype, decoder.int8_steps = WORKSPACES[workspace]
    try:
        # Every token's keys and values as the read computed them (the archive's role), the snapshot.
        capture, snapshot = SpanCapture(), decoder.new_cache(POLICY, mode)
        decoder.prefill(document_ids, snapshot, archive=capture)
        captured = capture.keys_values()
        spans = torch.cat((torch.arange(40, 120), torch.arange(300, 420), torch.arange(560, 600)))  # 240 tokens
        kv = {layer: (k[:, spans], v[:, spans]) for layer, (k, v) in captured.items()}
        question = torch.tensor(int4.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
        runs = {}
        for fast in (False, True):
            recaller = SpanRecaller(None, spans, focus=focus, n_tokens=len(document_ids), reread=kv)
            runs[fast] = answer_steps(decoder, snapshot, question, recaller, fast)
    finally:
        decoder.attention_dtype, decoder.int8_steps = saved
    (general, general_mass, general_calls, _), (fast, fast_mass, fast_calls, fork) = runs[False], runs[True]
    assert torch.equal(fast, general)
    assert all(torch.equal(a, b) for a, b in zip(fast_mass, general_mass, strict=True))
    layers = decoder.shape.num_layers
    assert general_calls == STEPS * layers
    recalled = fork.layers[0].recalled
    assert (recalled.focus_from is not None) == focus and (focus or not bool(recalled.valid.all()))
    # The general path only where a workspace was (re)built: the first step, and under focus or with
    # compact positions after each flush and eviction (every SLACK steps here, every 64 in the app).
    assert fast_calls < STEPS * layers // 3
    assert type(fork.layers[0]._workspace.held).__name__ == workspace


def pages() -> Document:
    """Eight 'pages' of distinct prose with one fact on page 6 (~1,400 tokens)."""
    topics = ["The harbour master counted {n} boats returning before the storm reached the bay.",
              "Engineers measured the old bridge and found {n} rusted bolts under the railing.",
              "The orchard behind the school gave {n} baskets of apples to the autumn market.",
              "A survey of the valley listed {n} species of birds nesting near the river."]
    texts = [" ".join(topics[(page + i) % 4].format(n=7 * page + i) for i in range(12)) for page in range(8)]
    texts[5] += " Note: the combination of the observatory safe is 48213."
    return Document(title="pages", source="", kind="pdf", pages=8,
                    segments=[Segment(text=t, label=f"page {i + 1}", page=i + 1, path=None) for i, t in enumerate(texts)])


def test_an_answer_over_span_recall_takes_the_fast_step_with_the_same_tokens(int4, tmp_path):
    """Through the app's question path (`DocumentSession.ask`: span recall from the archive, focus,
    the answer decoded on a fork of the snapshot): the same token ids with and without fast steps,
    and the fast step (`attend_step`) covered most layer steps, where before it covered none."""
    settings = EngineSettings(max_new_tokens=40, cache=CachePolicy(budget_tokens=256, window_tokens=64,
                                                                  residual_tokens=64, chunk_tokens=256),
                              recall=RecallSettings(recall_tokens=512))
    session = DocumentSession(int4, settings, PrefixStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2))
    report = session.open(pages())
    assert report.document_tokens > 4 * 256 and session.opened.report.recall_plan.source.value == "archive"
    taken, saved = {True: 0, False: 0}, decode_step_module.attend_step

    def counted(*args, **kwargs):
        out = saved(*args, **kwargs)
        taken[out is not None] += 1
        return out

    answers = {}
    decode_step_module.attend_step = counted
    try:
        for fast in (False, True):
            int4.decoder.fast_steps = fast
            answers[fast] = session.ask("What is the combination of the observatory safe?")
    finally:
        int4.decoder.fast_steps = True
        decode_step_module.attend_step = saved
    assert answers[True].recall.spans and answers[True].recall.tokens_recalled > 0
    assert len(answers[True].token_ids) >= 8
    assert answers[True].token_ids == answers[False].token_ids
    assert taken[True] > 2 * taken[False]


@pytest.mark.parametrize("focus", [True, False])
def test_fast_steps_over_recalled_tokens_after_a_speculative_chunk(int4, document_ids, focus):
    """Drafts attended pending and partly committed (`generate.speculative_step`) between single steps:
    the general path writes nothing into the rotated residual the fast step keeps under focus and in
    compact positions, so the fast step must rotate what the commit appended itself, bit for bit."""
    decoder = int4.decoder
    capture, snapshot = SpanCapture(), decoder.new_cache(POLICY, "compact")
    decoder.prefill(document_ids, snapshot, archive=capture)
    spans = torch.arange(100, 260)
    kv = {layer: (k[:, spans], v[:, spans]) for layer, (k, v) in capture.keys_values().items()}
    question = torch.tensor(int4.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
    runs = {}
    for fast in (False, True):
        fork = snapshot.fork()
        recaller = SpanRecaller(None, spans, focus=focus, n_tokens=len(document_ids), reread=kv)
        logits = [decoder.forward(question, fork, taps=ChunkTaps(recaller=recaller))]
        decoder.fast_steps = fast
        calls, undo = counting_attend()
        try:
            logits += steps_around_a_draft(decoder, fork)
        finally:
            decoder.fast_steps = True
            undo()
        runs[fast] = torch.cat(logits), calls["attend"]
    assert torch.equal(runs[True][0], runs[False][0])
    layers = decoder.shape.num_layers
    assert runs[False][1] == 7 * layers and runs[True][1] <= 2 * layers  # the first step and the chunk
