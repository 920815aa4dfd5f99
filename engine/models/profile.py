"""ModelProfile: the few numbers of a model's config that decide KV-cache memory.

Torch-free on purpose: the estimator (`engine.estimate`), the settings dialog and the CLI's
`estimate` use it before (or without) loading any weights.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelProfile:
    """Dimensions that decide KV-cache memory, read from a model config.

    KV bytes per token = 2 (K and V) · num_layers · kv_heads · head_dim · bytes per element.
    max_positions: the model's `max_position_embeddings` (tokens). vocab_size: tokens in its vocabulary.
    hidden_size, intermediate_size: its width and its MLP's (0: not known); with the rest they give
    its parameter count, which sizes how much a question reads (`engine.evidence.reading_budget`).
    """

    model_type: str
    num_layers: int
    kv_heads: int
    head_dim: int
    query_heads: int
    max_positions: int
    vocab_size: int
    hidden_size: int = 0
    intermediate_size: int = 0

    @classmethod
    def from_config(cls, config) -> ModelProfile:
        """Read a transformers `PretrainedConfig` (or anything with the same attributes).
        Raises AttributeError when the config lacks num_hidden_layers, num_attention_heads,
        hidden_size (without head_dim), max_position_embeddings or vocab_size."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            model_type=config.model_type,
            num_layers=config.num_hidden_layers,
            kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            query_heads=config.num_attention_heads,
            max_positions=int(config.max_position_embeddings),
            vocab_size=config.vocab_size,
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
            intermediate_size=int(getattr(config, "intermediate_size", 0) or 0),
        )
