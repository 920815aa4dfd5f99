"""`engine.models.norm.rms_norm` against the model's own RMSNorm, on the embedded model as the app
loads it on a CPU (int4 weights)."""

import pytest
import torch

from engine.documents import load_document


@pytest.fixture(scope="module")
def int4():
    from engine.models.loader import load_model

    return load_model("default", device="cpu", weights="int4")


@pytest.fixture(scope="module")
def document_ids(int4, corpus):
    doc = load_document(corpus / "pdf" / "P05_dmca.pdf")
    ids = int4.tokenizer("\n\n".join(s.text for s in doc.segments), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids[:640])  # past the budget: the prefill evicts already


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
