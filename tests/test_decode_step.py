"""A decode step in few operators (`engine.models.decode_step`, `engine.kvcache.step`) against the
general path (`CompressedDecoder.forward`'s layer loop with `LayerKV.attend`, the decode path before
it), on the embedded model with int4 weights as the app loads them on a CPU, over a real document
that fills the budget: 64 greedy steps in which the residual is flushed into the pool (and the
decode workspace appended to) and the cache evicts (and the workspace is compacted or rebuilt), for
each position mode and each form of the decode workspace. And `engine.models.norm.rms_norm` against
the model's own RMSNorm."""

import pytest
import torch

from engine.documents import load_document
from engine.kvcache.cache import LayerKV
from engine.settings import CachePolicy

STEPS = 64
SLACK = 8  # evict every few steps (the app's is 1/32 of the budget: `decode_eviction_slack`)
POLICY = CachePolicy(budget_tokens=384, window_tokens=128, residual_tokens=32, chunk_tokens=128)


@pytest.fixture(scope="module")
def int4():
    from engine.models.loader import load_model

    return load_model("default", device="cpu", weights="int4")


@pytest.fixture(scope="module")
def document_ids(int4, corpus):
    doc = load_document(corpus / "pdf" / "P05_dmca.pdf")
    ids = int4.tokenizer("\n\n".join(s.text for s in doc.segments), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids[:640])  # past the budget: the prefill evicts already


def steps_around_a_draft(decoder, fork) -> list[torch.Tensor]:
    """Two single steps, a 3-token draft attended pending of which 2 are committed
    (`generate.speculative_step`), then four single steps on `fork`: the logits of each call."""
    logits = []
    for token in (42, 43):
        logits.append(decoder.forward(torch.tensor([token]), fork, slack_tokens=SLACK, reuse_workspace=True))
    logits.append(decoder.forward(torch.tensor([7, 8, 9]), fork, all_logits=True, pending=True, reuse_workspace=True))
    fork.commit(2, SLACK)
    for token in (9, 10, 11, 12):
        logits.append(decoder.forward(torch.tensor([token]), fork, slack_tokens=SLACK, reuse_workspace=True))
    return logits


def greedy(decoder, cache, fast: bool):
    """64 greedy steps on a fork of `cache` (the app decodes on a fork of the document's snapshot):
    the logits of each, and how many times a layer ran `LayerKV.attend`, flushed the residual into
    its decode workspace and evicted."""
    fork, token, logits = cache.fork(), 42, []
    calls = dict.fromkeys(("attend", "_workspace_append", "_evict"), 0)
    saved = {name: getattr(LayerKV, name) for name in calls}

    def counting(name):
        def counted(self, *args, **kwargs):
            calls[name] += 1
            return saved[name](self, *args, **kwargs)
        return counted

    decoder.fast_steps = fast
    for name in calls:
        setattr(LayerKV, name, counting(name))
    try:
        for _ in range(STEPS):
            out = decoder.forward(torch.tensor([token]), fork, slack_tokens=SLACK, reuse_workspace=True)
            logits.append(out)
            token = int(out[-1].argmax())
    finally:
        decoder.fast_steps = True
        for name, method in saved.items():
            setattr(LayerKV, name, method)
    return torch.cat(logits), calls, fork


WORKSPACES = {  # the decode workspace's form -> (attention_dtype, int8_steps) that choose it (`packed_workspace`)
    "Bf16Int8Workspace": (torch.bfloat16, False),  # int4 weights on AVX-512 BF16
    "Int8Workspace": (torch.bfloat16, True),  # int4 weights without AVX-512 BF16
    "DenseWorkspace": (torch.float32, False),  # float32 attention
}


@pytest.mark.parametrize("workspace", list(WORKSPACES))
@pytest.mark.parametrize("mode", ["original", "compact"])
def test_fast_decode_steps_give_the_general_paths_logits_bit_for_bit(int4, document_ids, mode, workspace):
    decoder = int4.decoder
    assert decoder.fast_steps  # int4 layers, no Qwen3 head norms: the fast path is the one decode takes
    saved = decoder.attention_dtype, decoder.int8_steps
    decoder.attention_dtype, decoder.int8_steps = WORKSPACES[workspace]
    try:
        fork = compare(decoder, document_ids, mode)
    finally:
        decoder.attention_dtype, decoder.int8_steps = saved
    assert type(fork.layers[0]._workspace.held).__name__ == workspace


def compare(decoder, document_ids, mode):
    """Both paths' 64 steps on forks of one prefilled cache: equal logits; returns the fast one's fork."""
    cache = decoder.new_cache(POLICY, mode)
    decoder.prefill(document_ids, cache)
    general, general_calls, _ = greedy(decoder, cache, fast=False)
    fast, fast_calls, fork = greedy(decoder, cache, fast=True)
    assert torch.equal(fast, general)
    layers = decoder.shape.num_layers
    assert general_calls["attend"] == STEPS * layers
    # The fast path ran nearly every layer of every step: the general one only where a workspace or
    # its rotated residual was (re)built (the first step; compact positions: after each eviction).
    assert fast_calls["attend"] < STEPS * layers // 3
    # and the 64 steps did flush the residual into the workspaces and evict, in both runs alike
    assert fast_calls["_workspace_append"] == general_calls["_workspace_append"] >= layers
    assert fast_calls["_evict"] == general_calls["_evict"] >= 4 * layers
    return fork


def test_rms_norm_is_the_models_own_norm_bit_for_bit(int4, document_ids):
    """`rms_norm`'s few operators (a sum, a division, float32 constants) against the model's own
    RMSNorm module (transformers' `LlamaRMSNorm.forward`), on real activations and on scaled noise."""
    from engine.models.norm import rms_norm

    decoder = int4.decoder
    with torch.inference_mode():  # as the decoder runs it
        check_norms(decoder, rms_norm, decoder.embed(document_ids[:64]))


def check_norms(decoder, rms_norm, hidden):
    inputs = [hidden, hidden * 1e3, hidden[:1] * 1e-3] + [torch.randn(1, hidden.shape[1]) * 10.0**e for e in range(-4, 5)]
    for layer in decoder.layers[:4]:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            for x in inputs:
                assert torch.equal(rms_norm(norm, x), norm(x))


def test_fast_steps_after_a_speculative_chunk_give_the_general_paths_logits(int4, document_ids):
    """Drafts attended pending and partly committed (`generate.speculative_step`), then single
    steps: the fast path takes over the rotated residual the chunk left, bit for bit."""
    decoder = int4.decoder
    cache = decoder.new_cache(POLICY, "original")
    decoder.prefill(document_ids, cache)
    runs = {}
    for fast in (False, True):
        decoder.fast_steps = fast
        try:
            fork = cache.fork()
            logits = steps_around_a_draft(decoder, fork)
            runs[fast] = torch.cat(logits)
        finally:
            decoder.fast_steps = True
    assert torch.equal(runs[True], runs[False])


def test_fast_steps_on_the_1_5b_models_layout_with_biases():
    """A small random Qwen2 with the 1.5B shape's heads (12 query heads over 2 KV heads of 128, q/k/v
    biases) in int4: the fast path handles its group of 6 and the fused projection's bias, bit for bit."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.models.decoder import CompressedDecoder
    from engine.models.int4_cpu import quantize_for_cpu

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=1024, hidden_size=1536, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # transformers initialises biases to zero: make them count
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    quantize_for_cpu(model)
    decoder = CompressedDecoder(model, attention_dtype=torch.bfloat16)
    assert decoder.fast_steps and decoder.fused[0][0].bias is not None and decoder.shape.group == 6
    fork = compare(decoder, torch.randint(0, 1024, (640,)), "original")
    assert type(fork.layers[0]._workspace.held).__name__ == "Bf16Int8Workspace"
